"""Process control: the broker JVMs this module started, how to recognise them (and only them)
in ``/proc``, and how to stop them (gracefully, then SIGKILL), and which process holds a port.

A process counts as ours only when its command line carries our main class, the
``-Didempotent.service=<name>`` marker and, where a workdir is given,
``-Didempotent.service.workdir=<workdir>``: nothing else is ever signalled.
Part of the services helpers of :mod:`idempotent.testing.services`.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from idempotent.testing.services.maven import _java
from idempotent.testing.services.readiness import _pulsar_unload_all
from idempotent.testing.services.state import _info, _Spec

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _proc_state(pid: int) -> str | None:
    """The /proc state letter of pid, or None if it does not exist."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if not pathlib.Path("/proc").is_dir():  # no procfs: fall back to kill(0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                return "?"
            return "?"
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _reap(pid: int) -> None:
    """Collect the exit status of a JVM this process started (else it stays a zombie).

    Only our own Popen objects are reaped: waiting on other children of this process
    would steal their exit status.
    """
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]


def _alive(pid: int) -> bool:
    """True if pid is a running (not exited) process."""
    _reap(pid)
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _gone(pid: int) -> bool:
    """True once pid has fully exited and released its resources (sockets, files).

    After SIGKILL the thread-group leader of a JVM shows as a zombie while its other
    threads are still exiting and the listening sockets still exist; only once the last
    thread is gone (reapable, or a single task left) are the ports free again.
    """
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return False
        del _CHILDREN[pid]
        return True
    state = _proc_state(pid)
    if state is None:
        return True
    if state not in ("Z", "X"):
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1 and not os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True


def _cmdline(pid: int) -> list[str]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _workdir_flag(workdir: pathlib.Path) -> str:
    return f"-Didempotent.service.workdir={workdir}"


def _launch(
    spec: _Spec,
    lib: pathlib.Path,
    workdir: pathlib.Path,
    log: pathlib.Path,
    jvm_extra: Sequence[str],
    main_args: Sequence[str],
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``spec``'s JVM over the jars in ``lib`` in its own session, in ``workdir``, its
    output appended to ``log``, and keep it in ``_CHILDREN`` (reaped when it stops). Its
    command line carries the marks :func:`_is_ours` looks for (the service's name, ``workdir``).

    Raises:
        RuntimeError: no usable ``java`` (see :func:`~idempotent.testing.services.maven._java`).
        OSError: the JVM could not be started.
    """
    cmd = [
        _java(),
        *spec.jvm_flags,
        *jvm_extra,
        f"-Didempotent.service={spec.name}",
        _workdir_flag(workdir),
        "-cp",
        f"{lib}/*",
        spec.main_class,
        *main_args,
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc


def _is_ours(pid: int, spec: _Spec, workdir: pathlib.Path | None = None) -> bool:
    """True if pid is a broker JVM started by this module (for workdir, if given)."""
    args = _cmdline(pid)
    if spec.main_class not in args or f"-Didempotent.service={spec.name}" not in args:
        return False
    return workdir is None or _workdir_flag(workdir) in args


def _running_pid(spec: _Spec, state: Mapping[str, Any] | None) -> int | None:
    """The pid recorded in state if that process is alive and is our JVM for its workdir."""
    if state is None:
        return None
    pid = int(state.get("pid", 0))
    workdir = pathlib.Path(str(state.get("workdir")))
    if pid > 0 and _alive(pid) and _is_ours(pid, spec, workdir):
        return pid
    return None


def _our_jvms(spec: _Spec) -> list[int]:
    pids = []
    for entry in pathlib.Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid != os.getpid() and _is_ours(pid, spec) and _alive(pid):
            pids.append(pid)
    return pids


def _listening_inodes(ports: set[int]) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":  # LISTEN
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports:
                    inodes.add(fields[9])
    return inodes


def _holds_ports(pid: int, ports: set[int]) -> bool:
    inodes = _listening_inodes(ports)
    if not inodes:
        return False
    try:
        fds = list(pathlib.Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def _port_holders(ports: set[int]) -> str:
    """Describe which processes listen on ports (best effort, for error messages)."""
    holders = []
    for entry in pathlib.Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if _holds_ports(pid, ports):
            args = _cmdline(pid)
            marks = [a for a in args if a.startswith("-Didempotent.service")]
            holders.append(f"pid {pid} ({' '.join(marks) or (args[0] if args else '?')})")
    return ", ".join(holders) or "unknown process"


# ----------------------------------------------------------------------- readiness


def _terminate(pid: int, timeout: float) -> None:
    """SIGTERM pid, wait up to timeout, then SIGKILL; returns once it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not _gone(pid):
        _kill(pid)


def _graceful_stop(state: Mapping[str, Any], timeout: float) -> None:
    """Stop our broker JVM gracefully (then SIGKILL after timeout).

    Pulsar standalone runs the broker's and the embedded bookie's shutdown hooks
    concurrently on SIGTERM, so topics still open then fail to close their ledgers and
    persist their cursors ("Not enough non-faulty bookies"). Unloading every namespace
    through the admin API first closes them cleanly while the bookie is still up.
    """
    pid = int(state["pid"])
    deadline = time.monotonic() + timeout
    if state.get("name") == "pulsar":
        with contextlib.suppress(Exception):
            _pulsar_unload_all(_info(state), budget=min(30.0, timeout / 2))
    _terminate(pid, max(1.0, deadline - time.monotonic()))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _clean_stale(spec: _Spec, state: Mapping[str, Any] | None, workdir: pathlib.Path) -> None:
    """Stop leftover JVMs of ours: the one recorded in state, and any using workdir.

    A process is only a candidate if its command line carries our main class, our
    ``-Didempotent.service=<name>`` marker and ``-Didempotent.service.workdir=`` of the
    workdir in question; anything else (also our brokers from other workdirs, e.g. of
    another cache) is never touched - a port it holds makes the start fail instead.
    """
    pid = _running_pid(spec, state)
    if pid is not None:
        _terminate(pid, 20)
    if not pathlib.Path("/proc").is_dir():
        return
    for pid in _our_jvms(spec):
        if _is_ours(pid, spec, workdir):
            _terminate(pid, 20)
