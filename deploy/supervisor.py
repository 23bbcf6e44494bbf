"""`ssd serve` as a supervisor: a child that exits is started again, with backoff, while the others serve.

The services already survive each other (a target reconnects to a draft that comes back, the gateway routes
around a target that is down and polls it back to healthy), so restarting one child on its old address is
all the stack needs. Backoff doubles per quick exit (a child that exits within `healthy_after_s` of its start)
up to `max_backoff_s`, and starts over once a child has run that long.
"""

import threading
import time
from dataclasses import dataclass, field

import structlog

from deploy.local import Child, Stack, last_error, respawn

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    initial_backoff_s: float = 0.5  # the first restart's wait
    max_backoff_s: float = 30.0
    healthy_after_s: float = 60.0  # a child that ran this long has its backoff reset


@dataclass
class Supervisor:
    stack: Stack
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    _quick_exits: dict[str, int] = field(default_factory=dict)  # child name -> exits in a row that came quickly
    _restart_at: dict[str, float] = field(default_factory=dict)  # child name -> when its restart is due

    def backoff_s(self, child: Child) -> float:
        n = self._quick_exits.get(child.name, 0)
        return min(self.policy.max_backoff_s, self.policy.initial_backoff_s * 2**n)

    def check(self, now: float) -> None:
        """One pass: note children that exited, restart those whose backoff is over."""
        for child in self.stack.children:
            if child.proc.poll() is None:
                continue
            if child.name not in self._restart_at:
                ran_s = now - child.started_at
                if ran_s >= self.policy.healthy_after_s:
                    self._quick_exits[child.name] = 0
                wait_s = self.backoff_s(child)
                self._quick_exits[child.name] = self._quick_exits.get(child.name, 0) + 1
                self._restart_at[child.name] = now + wait_s
                log.warning("service exited; restarting it", service=child.name, pid=child.proc.pid,
                            exit_code=child.proc.returncode, ran_s=round(ran_s, 1), backoff_s=wait_s,
                            cause=last_error(child.log_path, child.log_start) if child.log_path else None,
                            log=str(child.log_path) if child.log_path else None)
            elif now >= self._restart_at[child.name]:
                del self._restart_at[child.name]
                respawn(child)

    def run(self, stop: threading.Event, interval_s: float = 0.2) -> None:
        """Supervise until `stop` is set (the caller then stops the stack)."""
        while not stop.is_set():
            self.check(time.monotonic())
            stop.wait(interval_s)
