"""Workers never outlive torchrun's agent: a rank whose agent dies (SIGKILL, the OOM killer) checkpoints and stops.

torchrun starts each worker in a session of its own, so nothing the kernel does on the agent's death reaches
the workers: they are re-parented and, their collectives needing no agent, train on for good, with nothing
left to stop them by (`train_run stop` signals the agent it launched). Each worker therefore watches its
parent: when the parent it started under is gone, it sends itself SIGTERM, which the trainer takes as any stop
(finish the step, agree with the other ranks, save, `run_stopped`). Before the trainer's handler is installed
(early start-up) that SIGTERM ends the process, which has nothing to save yet.

A thread polling `getppid()` rather than `PR_SET_PDEATHSIG`: the death signal fires when the *thread* that
forked the worker exits, which in the agent need not be its main thread, and it is Linux-only. No torch here.
"""

from __future__ import annotations

import os
import signal
import threading
import typing

POLL_SECONDS = 1.0
"""How often a worker asks whether its agent is still its parent: about a step's worth of delay at most."""

UNDER_AGENT = "TORCHELASTIC_RUN_ID"
"""Set by torchrun's agent in each worker's environment: a worker of an agent, not a process launched alone."""


class AgentWatch:
    """Watches the parent this process started under; `gone` is the dead agent's pid once it has died."""

    def __init__(self, parent: int, on_gone: typing.Callable[[int], None] | None = None):
        self.parent = parent
        self.gone: int | None = None
        self._on_gone = on_gone or _stop_self
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tideborn-agent-watch", daemon=True)

    @classmethod
    def start_if_under_agent(cls, environ: typing.Mapping[str, str] | None = None) -> AgentWatch | None:
        """Start watching when this process is a worker of torchrun's agent; None for a process launched alone."""
        environ = os.environ if environ is None else environ
        if not environ.get(UNDER_AGENT):
            return None
        watch = cls(os.getppid())
        watch._thread.start()
        return watch

    def parent_gone(self) -> bool:
        """Whether the agent this process started under has died (it is no longer this process's parent)."""
        return self.gone is not None or os.getppid() != self.parent

    def close(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(POLL_SECONDS):
            if os.getppid() != self.parent:
                self.gone = self.parent
                self._on_gone(self.parent)
                return


def gone_text(agent_pid: int) -> str:
    return (f"torchrun's agent (pid {agent_pid}) is gone: this worker (pid {os.getpid()}) checkpoints and stops "
            "with the other ranks rather than train on without it")


def _stop_self(agent_pid: int) -> None:
    try:
        os.write(2, f"{gone_text(agent_pid)}\n".encode())
    except OSError:
        pass  # stderr went with the agent's terminal: the run_stopped event still says why
    os.kill(os.getpid(), signal.SIGTERM)
