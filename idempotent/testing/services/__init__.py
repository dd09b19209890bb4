"""Real single-node Kafka and Pulsar brokers on 127.0.0.1, for tests, CI and by hand.

The brokers are plain JVMs started from classpaths resolved once from Maven Central
(``install``) into :func:`cache_dir`, outside the repository:

* ``kafka``: Apache Kafka 4.x in KRaft mode (combined broker + controller, no
  ZooKeeper), main class ``kafka.Kafka`` (see ``poms/kafka.xml``).
* ``pulsar``: Apache Pulsar 3.0.x standalone (broker + one embedded bookie, RocksDB
  metadata), main class ``org.apache.pulsar.PulsarStandaloneStarter``
  (see ``poms/pulsar.xml``).

State (pid, ports, workdir) lives in ``cache_dir()/run/<name>.json`` so that ``up``
in one process and ``down`` in another work; every mutating call holds an exclusive
``flock`` on ``cache_dir()/run/<name>.lock``. Data lives in the service's workdir
(default ``/dev/shm/idempotent-<uid>-<hash>/<name>``): wiped by ``up`` (fresh), kept
by :func:`restart` and by :func:`kill9` followed by ``up(name, fresh=False)``.

The code is split by concern into sibling modules, re-exported here: ``state``
(specs, paths, run state), ``maven`` (download), ``process`` (process
control), ``ports`` (ports), ``readiness`` (readiness) and
``config`` (workdir and configuration templates). This module keeps the API: the
life cycle of a broker and the command line.

Command line (also wired as ``idempotent services ...``)::

    python -m idempotent.testing.services up|down|status|install|restart|kill9|clean kafka|pulsar|all

and for the 3-node replicated Kafka cluster of :mod:`idempotent.testing.services.kafka_cluster`::

    python -m idempotent.testing.services up|down|status|install|clean kafka-cluster
    python -m idempotent.testing.services restart kafka-cluster [--node N]   # rolling without --node
    python -m idempotent.testing.services kill9 kafka-cluster --node N

``all`` means ``kafka`` and ``pulsar`` for ``up``, ``status``, ``install``, ``restart`` and
``kill9`` (the cluster's three JVMs are for the tests that need them); ``down all`` and
``clean all`` also stop and clean ``kafka-cluster``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from idempotent.testing.services.config import _check_wipeable as _check_wipeable
from idempotent.testing.services.config import _prepare_kafka as _prepare_kafka
from idempotent.testing.services.config import _prepare_pulsar as _prepare_pulsar
from idempotent.testing.services.config import _prepare_workdir as _prepare_workdir
from idempotent.testing.services.maven import _DEPENDENCY_PLUGIN as _DEPENDENCY_PLUGIN
from idempotent.testing.services.maven import _home as _home
from idempotent.testing.services.maven import _java as _java
from idempotent.testing.services.maven import _locked as _locked
from idempotent.testing.services.maven import _tail as _tail
from idempotent.testing.services.maven import _version as _version
from idempotent.testing.services.maven import install
from idempotent.testing.services.ports import _free_ports as _free_ports
from idempotent.testing.services.ports import _port_free as _port_free
from idempotent.testing.services.process import _CHILDREN as _CHILDREN
from idempotent.testing.services.process import _clean_stale as _clean_stale
from idempotent.testing.services.process import _graceful_stop as _graceful_stop
from idempotent.testing.services.process import _is_ours as _is_ours
from idempotent.testing.services.process import _kill as _kill
from idempotent.testing.services.process import _launch
from idempotent.testing.services.process import _our_jvms as _our_jvms
from idempotent.testing.services.process import _port_holders as _port_holders
from idempotent.testing.services.process import _running_pid as _running_pid
from idempotent.testing.services.process import _terminate as _terminate
from idempotent.testing.services.process import _workdir_flag as _workdir_flag
from idempotent.testing.services.readiness import _answers as _answers
from idempotent.testing.services.readiness import _kafka_ready as _kafka_ready
from idempotent.testing.services.readiness import _pulsar_ready as _pulsar_ready
from idempotent.testing.services.state import _CONF_DIR as _CONF_DIR
from idempotent.testing.services.state import _HOST as _HOST
from idempotent.testing.services.state import _POM_DIR as _POM_DIR
from idempotent.testing.services.state import _SPECS as _SPECS
from idempotent.testing.services.state import SERVICES, ServiceInfo, _remove_workdir, cache_dir
from idempotent.testing.services.state import _default_workdir as _default_workdir
from idempotent.testing.services.state import _info as _info
from idempotent.testing.services.state import _read_state as _read_state
from idempotent.testing.services.state import _run_dir as _run_dir
from idempotent.testing.services.state import _Spec as _Spec
from idempotent.testing.services.state import _spec as _spec
from idempotent.testing.services.state import _state_path as _state_path
from idempotent.testing.services.state import _write_state as _write_state

__all__ = [
    "SERVICES",
    "ServiceInfo",
    "cache_dir",
    "clean",
    "down",
    "install",
    "kill9",
    "main",
    "restart",
    "status",
    "up",
]


# ----------------------------------------------------------------------------- start


def _start(spec: _Spec, *, ports: dict[str, int], workdir: pathlib.Path, fresh: bool, timeout: float) -> ServiceInfo:
    """Start the JVM (lock held by the caller) and wait until it answers."""
    lib = install(spec.name)
    _prepare_workdir(workdir, fresh)
    log = workdir / "broker.log"
    with log.open("ab") as out:
        out.write(f"--- idempotent: starting {spec.name} at {time.ctime()} ---\n".encode())
    prepare = _prepare_kafka if spec.name == "kafka" else _prepare_pulsar
    jvm_extra, main_args = prepare(lib, workdir, ports, log)
    env = {k: v for k, v in os.environ.items() if k != "PULSAR_STANDALONE_USE_ZOOKEEPER"}
    started = time.monotonic()
    proc = _launch(spec, lib, workdir, log, jvm_extra, main_args, env)
    state: dict[str, Any] = {
        "name": spec.name,
        "pid": proc.pid,
        "ports": dict(ports),
        "workdir": str(workdir),
        "main_class": spec.main_class,
        "version": _version(spec),
        "started_at": time.time(),
    }
    _write_state(spec.name, state)
    info = _info(state)

    def check_alive() -> None:
        if proc.poll() is not None:
            raise _Died(f"{spec.name} JVM exited with code {proc.returncode} while starting")

    ready = _kafka_ready if spec.name == "kafka" else _pulsar_ready
    try:
        ready(info, started + timeout, check_alive)
    except BaseException as exc:
        _kill(proc.pid)
        _state_path(spec.name).unlink(missing_ok=True)
        if isinstance(exc, _Died | TimeoutError):
            raise RuntimeError(
                f"{spec.name} did not become ready within {timeout:.0f} s ({exc}); last lines of {log}:\n{_tail(log)}"
            ) from exc
        raise
    state["ready_seconds"] = round(time.monotonic() - started, 2)
    _write_state(spec.name, state)
    return info


class _Died(RuntimeError):
    pass


def _stored_ports(spec: _Spec, state: Mapping[str, Any] | None, workdir: pathlib.Path) -> dict[str, int] | None:
    sources: list[Mapping[str, Any]] = []
    if state is not None and pathlib.Path(str(state.get("workdir"))) == workdir:
        sources.append(state)
    with contextlib.suppress(OSError, ValueError):
        sources.append(json.loads((workdir / "service.json").read_text()))
    for source in sources:
        ports = source.get("ports")
        if isinstance(ports, dict) and all(k in ports for k in spec.port_keys):
            return {k: int(ports[k]) for k in spec.port_keys}
        if isinstance(ports, dict) and all(k in ports for k in spec.port_keys[:3]):
            return _with_new_ports(spec, ports)  # kept from before the TLS listeners
    return None


def _with_new_ports(spec: _Spec, ports: Mapping[str, Any]) -> dict[str, int]:
    """``ports`` plus free ports for the keys it lacks (listeners added since it was stored)."""
    kept = {k: int(ports[k]) for k in spec.port_keys if k in ports}
    missing = [k for k in spec.port_keys if k not in kept]
    return {**kept, **dict(zip(missing, _free_ports(len(missing), exclude=set(kept.values())), strict=True))}


# ----------------------------------------------------------------------------- API


def up(
    name: str, *, port: int | None = None, workdir: str | None = None, timeout: float = 180.0, fresh: bool = True
) -> ServiceInfo:
    """Start broker ``name`` on 127.0.0.1 and wait until it really answers.

    Idempotent: if our broker is already running and answering it is returned as is
    (``port``/``fresh`` are then ignored unless ``port`` conflicts). Otherwise stale
    state is cleaned first: a state file with a dead pid is dropped, and a hung or
    leftover JVM of ours - command line with our main class, the
    ``-Didempotent.service=<name>`` marker and this workdir - is stopped (SIGTERM, then
    SIGKILL). Other processes are never touched; if one holds a needed port, the start
    fails with RuntimeError naming it.

    ``port`` is the client port (Kafka listener / Pulsar binary port); all other
    ports (Kafka controller, Pulsar web + bookie) are chosen free. ``workdir``
    defaults to ``/dev/shm/idempotent-<uid>-<hash>/<name>`` (or under the run dir).
    ``fresh=True`` wipes the workdir (only if it is empty or was created by us);
    ``fresh=False`` keeps its data and reuses the previous run's ports (needed by the
    Pulsar bookie, whose id is its port) unless ``port`` is given - e.g. after
    :func:`kill9`. Kafka is formatted only when its data dir is not yet formatted.

    Readiness: Kafka = metadata + probe topic create + transactional commit + delete;
    Pulsar = ``/admin/v2/brokers/health`` 200 + one message sent by a producer.

    Raises ValueError (unknown name, workdir we may not wipe, port conflicts with the
    running broker), RuntimeError (install failed, port held by a foreign process, or
    not ready within ``timeout`` s: the message has the last 40 lines of
    ``<workdir>/broker.log`` and no JVM is left running).
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        state = _read_state(name)
        if state is not None and _running_pid(spec, state) is not None:
            info = _info(state)
            if port is not None and int(state["ports"][spec.port_keys[0]]) != port:
                raise ValueError(f"{name} already running on {info.url}; call down() first to use {port}")
            if _answers(info, timeout=10):
                return info
        if workdir is not None:
            target = pathlib.Path(workdir).expanduser().resolve()
        elif state is not None and not fresh:
            target = pathlib.Path(str(state["workdir"]))
        else:
            target = _default_workdir(name)
        if fresh:
            _check_wipeable(target)
        ports = None if fresh else _stored_ports(spec, state, target)
        chosen_by_us = ports is None
        if ports is None:
            free = _free_ports(len(spec.port_keys), exclude={port} if port else set())
            ports = dict(zip(spec.port_keys, free, strict=True))
        if port is not None:
            ports[spec.port_keys[0]] = port
        _clean_stale(spec, state, target)
        _state_path(name).unlink(missing_ok=True)
        attempts = 3 if chosen_by_us and port is None else 1
        for attempt in range(attempts):
            busy = [p for p in ports.values() if not _port_free(p)]
            if busy and attempt + 1 < attempts:  # lost a race for a free port: pick again
                free = _free_ports(len(spec.port_keys), exclude=set(busy))
                ports = dict(zip(spec.port_keys, free, strict=True))
                continue
            if busy:
                raise RuntimeError(
                    f"cannot start {name}: port(s) {busy} on {_HOST} are in use by another process: "
                    + _port_holders(set(busy))
                )
            return _start(spec, ports=ports, workdir=target, fresh=fresh, timeout=timeout)
        raise AssertionError("unreachable")


def down(name: str, timeout: float = 60.0) -> bool:
    """Stop broker ``name``: SIGTERM, wait up to ``timeout`` s, then SIGKILL.

    Also stops leftover JVMs of ours using the same workdir. Removes the run state
    file; the workdir (data and ``broker.log``) is kept until the next fresh ``up``.
    Returns True if a process was stopped, False if nothing was running. Raises
    ValueError for an unknown name.
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        state = _read_state(name)
        stopped = False
        if state is not None:
            workdir = pathlib.Path(str(state["workdir"]))
            if _running_pid(spec, state) is not None:
                _graceful_stop(state, timeout)
                stopped = True
            if pathlib.Path("/proc").is_dir():
                for other in _our_jvms(spec):
                    if _is_ours(other, spec, workdir):
                        _terminate(other, timeout)
                        stopped = True
        _state_path(name).unlink(missing_ok=True)
        return stopped


def status(name: str) -> ServiceInfo | None:
    """Return the running broker if its JVM is alive, ours and answering, else None.

    Read-only: takes no lock and leaves stale state in place (``up`` cleans it, and
    ``up(fresh=False)`` after :func:`kill9` reuses it). Raises ValueError for an
    unknown name.
    """
    spec = _spec(name)
    state = _read_state(name)
    if state is None or _running_pid(spec, state) is None:
        return None
    info = _info(state)
    return info if _answers(info) else None


def kill9(name: str) -> None:
    """SIGKILL the broker JVM (crash tests) and wait until it is gone.

    The state file and workdir are kept, so ``up(name, fresh=False)`` restarts on the
    same ports and data. Raises RuntimeError if the broker is not running, ValueError
    for an unknown name.
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        pid = _running_pid(spec, _read_state(name))
        if pid is None:
            raise RuntimeError(f"{name} is not running")
        _kill(pid)


def restart(name: str, timeout: float = 180.0) -> ServiceInfo:
    """Stop the broker gracefully and start it again on the same ports and data dir.

    Works after :func:`kill9` as well (then there is nothing to stop). Raises
    RuntimeError if there is no state for ``name`` (never started, or ``down`` was
    called) or if it does not become ready (see :func:`up`).
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        state = _read_state(name)
        if state is None:
            raise RuntimeError(f"{name} is not running; nothing to restart")
        workdir = pathlib.Path(str(state["workdir"]))
        if _running_pid(spec, state) is not None:
            _graceful_stop(state, 60)
        ports = _with_new_ports(spec, state["ports"])
        _clean_stale(spec, None, workdir)
        busy = [p for p in ports.values() if not _port_free(p)]
        if busy:
            raise RuntimeError(f"cannot restart {name}: port(s) {busy} are in use: " + _port_holders(set(busy)))
        return _start(spec, ports=ports, workdir=workdir, fresh=False, timeout=timeout)


def clean(name: str) -> list[pathlib.Path]:
    """Remove the data of this cache's broker ``name`` (its default workdir, under
    ``/dev/shm/idempotent-<uid>-<hash of cache_dir()>``), and that directory once it is
    empty; never another cache's or user's. Returns what was removed.

    Raises:
        RuntimeError: the broker is running (stop it first with ``down``).
        ValueError: unknown name.
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        if _running_pid(spec, _read_state(name)) is not None:
            raise RuntimeError(f"{name} is running: stop it first (idempotent services down {name})")
        return _remove_workdir(name)


# ----------------------------------------------------------------------------- CLI


# ----------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``services up|down|status|install|restart|kill9|clean kafka|pulsar|all``.

    ``clean`` removes this cache's broker data (see :func:`clean`), refused while it runs.

    ``up`` prints each broker's URL on stdout (one line per service, for
    ``URL=$(... up kafka)``); ``status`` prints ``NAME URL (pid N)`` or
    ``NAME not running`` and exits 1 if any is not running; ``install`` prints the
    lib dir. Progress and errors go to stderr; the exit code is 1 on failure.
    """
    parser = argparse.ArgumentParser(
        prog="idempotent services", description="Run real single-node brokers on 127.0.0.1."
    )
    parser.add_argument("command", choices=("up", "down", "status", "install", "restart", "kill9", "clean"))
    parser.add_argument("service", choices=(*SERVICES, _CLUSTER, "all"))
    parser.add_argument("--port", type=int, default=None, help="client port (up; one service)")
    parser.add_argument(
        "--keep-data", action="store_true", help="up: keep the previous data dir and ports (fresh=False)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument(
        "--node", type=int, default=None, help=f"{_CLUSTER}: the node id for kill9 (needed) and restart"
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    names = list(SERVICES) if args.service == "all" else [args.service]
    if args.service == "all" and args.command in ("down", "clean"):
        names.append(_CLUSTER)
    if args.port is not None and (len(names) > 1 or names == [_CLUSTER]):
        parser.error("--port needs a single service (and the cluster chooses its own ports)")
    if args.node is not None and names != [_CLUSTER]:
        parser.error(f"--node is for {_CLUSTER} only")
    if names == [_CLUSTER] and args.command == "kill9" and args.node is None:
        parser.error(f"kill9 {_CLUSTER} needs --node N")
    rc = 0
    for name in names:
        try:
            if name == _CLUSTER:
                rc = _cluster_command(args) or rc
            elif args.command == "install":
                print(install(name))
            elif args.command == "up":
                info = up(name, port=args.port, fresh=not args.keep_data, timeout=args.timeout or 180.0)
                print(info.connect_url)
            elif args.command == "restart":
                print(restart(name, timeout=args.timeout or 180.0).connect_url)
            elif args.command == "down":
                stopped = down(name, timeout=args.timeout or 60.0)
                print(f"{name} {'stopped' if stopped else 'was not running'}")
            elif args.command == "clean":
                removed = clean(name)
                print(f"{name}: removed {', '.join(map(str, removed))}" if removed else f"{name}: no data to remove")
            elif args.command == "kill9":
                kill9(name)
                print(f"{name} killed")
            else:
                found = status(name)
                if found is None:
                    print(f"{name} not running")
                    rc = 1
                else:
                    print(f"{found.name} {found.connect_url} (pid {found.pid})")
        except (RuntimeError, ValueError, OSError) as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            rc = 1
    return rc


_CLUSTER = "kafka-cluster"


def _cluster_command(args: argparse.Namespace) -> int:
    """One command of :func:`main` for the 3-node cluster; returns the exit code."""
    import idempotent.testing.services.kafka_cluster as kafka_cluster

    if args.command == "install":
        print(install("kafka"))
    elif args.command == "up":
        print(kafka_cluster.up(fresh=not args.keep_data, timeout=args.timeout or 300.0).url)
    elif args.command == "restart":
        if args.node is None:
            kafka_cluster.rolling_restart(timeout_per_node=args.timeout or 180.0)
        else:
            kafka_cluster.restart(args.node, timeout=args.timeout or 180.0)
        print(kafka_cluster.url())
    elif args.command == "down":
        stopped = kafka_cluster.down(timeout=args.timeout or 60.0)
        print(f"{_CLUSTER} {'stopped' if stopped else 'was not running'}")
    elif args.command == "clean":
        removed = kafka_cluster.clean()
        print(f"{_CLUSTER}: removed {', '.join(map(str, removed))}" if removed else f"{_CLUSTER}: no data to remove")
    elif args.command == "kill9":
        kafka_cluster.kill9(args.node)
        print(f"{_CLUSTER} node {args.node} killed")
    else:
        found = kafka_cluster.status()
        if found is None:
            print(f"{_CLUSTER} not running")
            return 1
        pids = ", ".join(f"node {n.node_id} pid {n.pid}" for n in found.nodes)
        print(f"{_CLUSTER} {found.url} ({pids})")
    return 0
