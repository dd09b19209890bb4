"""A real 3-node Kafka cluster on 127.0.0.1 for fault tests and benchmarks: replicated as in
production, and each node can be killed, paused, stopped and started on its own.

Three JVMs of Apache Kafka 4.x in KRaft mode (the single-node ``kafka`` service's classpath,
see :mod:`idempotent.testing.services`), each a combined broker + controller: node ids 1..3,
a static quorum of the 3 voters, each node with its own client and controller ports, data
dir and log (``<workdir>/node-<id>/``; the workdir defaults to
``/dev/shm/idempotent-<uid>-<hash>/kafka-cluster``). Topics get 3 replicas and
``min.insync.replicas=2`` by default, and so do Kafka's own internal topics (consumer offsets,
transaction state); a killed or paused node is fenced after 5 s without heartbeats (see
``conf/kafka-cluster-server.properties``).

The cluster's state (pids, ports, workdir) is ``cache_dir()/run/kafka-cluster.json``, so
``up`` in one process and a fault or ``down`` in another work; every call that changes a
node holds the lock ``cache_dir()/run/kafka-cluster.lock``. Only JVMs whose command line
carries ``kafka.Kafka``, ``-Didempotent.service=kafka-cluster`` and the node's own workdir are
ever signalled.

Life cycle: :func:`up`, :func:`down`, :func:`status`, :func:`clean` (also
``idempotent services up|down|status|restart|kill9|clean kafka-cluster``). Faults, on a node
id: :func:`kill9`, :func:`start`, :func:`stop`, :func:`restart`, :func:`rolling_restart`,
:func:`pause`, :func:`resume`. Questions: :func:`info`, :func:`node_pids`,
:func:`leader_of`, :func:`active_controller`, :func:`partitions`, :func:`wait_in_sync`,
:func:`wait_healthy`, :func:`create_topic`; :func:`heal` undoes every fault. Every wait is
bounded by a ``timeout`` and raises TimeoutError past it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from idempotent.testing.services.config import (
    _check_wipeable,
    _kafka_cluster_id,
    _log4j,
    _prepare_workdir,
    _render,
    _storage_format,
)
from idempotent.testing.services.maven import _locked, _tail, install
from idempotent.testing.services.ports import _can_connect, _free_ports, _port_free
from idempotent.testing.services.process import (
    _alive,
    _is_ours,
    _kill,
    _launch,
    _our_jvms,
    _port_holders,
    _proc_state,
    _terminate,
)
from idempotent.testing.services.state import (
    _HOST,
    _SPECS,
    _default_workdir,
    _remove_workdir,
    _run_dir,
)
from idempotent.testing.services.state import _read_state as _read_service_state
from idempotent.testing.services.state import _state_path as _service_state_path
from idempotent.testing.services.state import _write_state as _write_service_state

__all__ = [
    "NAME",
    "NODES",
    "ClusterInfo",
    "NodeInfo",
    "PartitionState",
    "active_controller",
    "bootstrap",
    "clean",
    "create_topic",
    "down",
    "heal",
    "info",
    "kill9",
    "leader_of",
    "node_pids",
    "partitions",
    "pause",
    "restart",
    "resume",
    "rolling_restart",
    "start",
    "status",
    "stop",
    "up",
    "url",
    "wait_healthy",
    "wait_in_sync",
]

NAME = "kafka-cluster"

#: the node ids; each node is a broker and a controller (a voter of the static quorum)
NODES = (1, 2, 3)

_PROBE_TOPIC = "__idempotent_cluster_probe"

# the single-node service's JVM, with a smaller heap: three of them share the machine
_SPEC = attrs.evolve(
    _SPECS["kafka"],
    name=NAME,
    port_keys=("port", "controller_port"),
    jvm_flags=(*(f for f in _SPECS["kafka"].jvm_flags if not f.startswith(("-Xms", "-Xmx"))), "-Xms192m", "-Xmx448m"),
)

_QUIET: dict[str, Any] = {"log_level": 0}


# ----------------------------------------------------------------------------- values


@attrs.frozen
class NodeInfo:
    """One node of the cluster: its id, ports, directory and JVM (``pid`` None: not running)."""

    node_id: int
    port: int
    controller_port: int
    workdir: str
    pid: int | None

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``: this node's client listener."""
        return f"{_HOST}:{self.port}"

    @property
    def log(self) -> pathlib.Path:
        """The node's log (the JVM's stdout and stderr)."""
        return pathlib.Path(self.workdir) / "broker.log"

    @property
    def data_dir(self) -> pathlib.Path:
        """The node's ``log.dirs`` (topic partitions and ``__cluster_metadata-0``)."""
        return pathlib.Path(self.workdir) / "data"


@attrs.frozen
class ClusterInfo:
    """The cluster as its state file describes it (nodes in id order)."""

    nodes: tuple[NodeInfo, ...]
    workdir: str
    name: str = NAME

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``, what the native client takes."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def url(self) -> str:
        """``kafka://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``, for :func:`idempotent.connect`."""
        return f"kafka://{self.bootstrap}"

    @property
    def connect_url(self) -> str:
        """The backend URL for :func:`idempotent.connect` (the same as :attr:`url`)."""
        return self.url

    def node(self, node_id: int) -> NodeInfo:
        """The node with this id; ValueError for an id not in :data:`NODES`."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise ValueError(f"no node {node_id!r} in {NAME}; the nodes are {list(NODES)}")


@attrs.frozen
class PartitionState:
    """One partition as the cluster's metadata has it (``leader`` -1: none)."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def in_sync(self) -> bool:
        """A leader, and every replica in the ISR."""
        return self.leader >= 0 and set(self.isr) == set(self.replicas)


# ----------------------------------------------------------------------------- state


def _state_path() -> pathlib.Path:
    return _service_state_path(NAME)


def _lock() -> contextlib.AbstractContextManager[None]:
    return _locked(_run_dir() / f"{NAME}.lock")


def _read_state() -> dict[str, Any] | None:
    state = _read_service_state(NAME)
    return state if state is not None and isinstance(state.get("nodes"), dict) else None


def _write_state(state: Mapping[str, Any]) -> None:
    _write_service_state(NAME, state)


def _node_dir(workdir: pathlib.Path, node_id: int) -> pathlib.Path:
    return workdir / f"node-{node_id}"


def _node_pid(state: Mapping[str, Any], node_id: int) -> int | None:
    """The node's recorded pid if that process is alive and is our JVM for its workdir."""
    node = state["nodes"].get(str(node_id), {})
    pid = int(node.get("pid") or 0)
    workdir = _node_dir(pathlib.Path(str(state["workdir"])), node_id)
    if pid > 0 and _alive(pid) and _is_ours(pid, _SPEC, workdir):
        return pid
    return None


def _info(state: Mapping[str, Any]) -> ClusterInfo:
    workdir = pathlib.Path(str(state["workdir"]))
    nodes = []
    for node_id in NODES:
        ports = state["nodes"][str(node_id)]["ports"]
        nodes.append(
            NodeInfo(
                node_id=node_id,
                port=int(ports["port"]),
                controller_port=int(ports["controller_port"]),
                workdir=str(_node_dir(workdir, node_id)),
                pid=_node_pid(state, node_id),
            )
        )
    return ClusterInfo(nodes=tuple(nodes), workdir=str(workdir))


def _state_or_raise() -> dict[str, Any]:
    state = _read_state()
    if state is None:
        raise RuntimeError(f"{NAME} is not up (idempotent services up {NAME})")
    return state


def _check_node(node_id: int) -> None:
    if node_id not in NODES:
        raise ValueError(f"no node {node_id!r} in {NAME}; the nodes are {list(NODES)}")


# ----------------------------------------------------------------------------- processes


class _NodeExited(RuntimeError):
    """A node that was being started exited: no point waiting for it."""


def _voters(state: Mapping[str, Any]) -> str:
    return ",".join(f"{n}@{_HOST}:{state['nodes'][str(n)]['ports']['controller_port']}" for n in NODES)


def _render_node(state: Mapping[str, Any], node_id: int) -> pathlib.Path:
    node_dir = _node_dir(pathlib.Path(str(state["workdir"])), node_id)
    node_dir.mkdir(parents=True, exist_ok=True)
    props = node_dir / "server.properties"
    ports = state["nodes"][str(node_id)]["ports"]
    values = {"node_id": node_id, **ports, "voters": _voters(state), "data_dir": node_dir / "data"}
    _render("kafka-cluster-server.properties", props, values)
    return props


def _format(lib: pathlib.Path, state: Mapping[str, Any], deadline: float) -> None:
    """Format every node's data dir that is not formatted yet, all with the cluster's id, in
    parallel (each a short JVM)."""
    running: list[tuple[int, subprocess.Popen[bytes], pathlib.Path]] = []
    for node_id in NODES:
        props = _render_node(state, node_id)
        node_dir = props.parent
        if (node_dir / "data" / "meta.properties").exists():
            continue
        log = node_dir / "broker.log"
        cmd = _storage_format(lib, props, str(state["cluster_id"]))
        with log.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=node_dir)
        running.append((node_id, proc, log))
    failed = []
    for node_id, proc, log in running:
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = -9
        if rc != 0:
            failed.append(f"node {node_id} (exit {rc}):\n{_tail(log)}")
    if failed:
        raise RuntimeError("kafka storage format failed for " + "\n".join(failed))


def _spawn(lib: pathlib.Path, state: dict[str, Any], node_id: int) -> int:
    """Start node ``node_id``'s JVM (lock held, data dir formatted); record its pid."""
    props = _render_node(state, node_id)
    node_dir = props.parent
    ports = [int(p) for p in state["nodes"][str(node_id)]["ports"].values()]
    busy = [p for p in ports if not _port_free(p)]
    if busy:
        raise RuntimeError(
            f"cannot start {NAME} node {node_id}: port(s) {busy} are in use: " + _port_holders(set(busy))
        )
    log = node_dir / "broker.log"
    with log.open("ab") as out:
        out.write(f"--- idempotent: starting {NAME} node {node_id} at {time.ctime()} ---\n".encode())
    proc = _launch(_SPEC, lib, node_dir, log, [_log4j()], [str(props)])
    # until the child has exec'd the JVM its command line is still this process's, and it
    # would not count as ours (nor as running)
    deadline = time.monotonic() + 30
    while not _is_ours(proc.pid, _SPEC, node_dir) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    state["nodes"][str(node_id)]["pid"] = proc.pid
    _write_state(state)
    return proc.pid


def _check_started(state: Mapping[str, Any], node_ids: Iterable[int]) -> Callable[[], None]:
    def check() -> None:
        for node_id in node_ids:
            if _node_pid(state, node_id) is None:
                log = _node_dir(pathlib.Path(str(state["workdir"])), node_id) / "broker.log"
                raise _NodeExited(f"{NAME} node {node_id} exited while starting; last lines of {log}:\n{_tail(log)}")

    return check


def _continue(pid: int) -> None:
    """SIGCONT a paused JVM (a stopped process would not act on SIGTERM)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _stop_node(state: Mapping[str, Any], node_id: int, timeout: float) -> bool:
    """SIGTERM the node (Kafka's controlled shutdown: its leaderships move first), wait until
    it has exited, SIGKILL after ``timeout``. False if it was not running."""
    pid = _node_pid(state, node_id)
    if pid is None:
        return False
    _continue(pid)
    _terminate(pid, timeout)
    return True


# ----------------------------------------------------------------------------- clients


def _admin(bootstrap_servers: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap_servers, **_QUIET})


def _live_bootstrap(cluster: ClusterInfo, exclude: Iterable[int] = ()) -> str:
    """The running, not paused nodes' addresses but those of ``exclude`` (if that leaves
    none: all running ones; if none runs: all)."""
    live = [n for n in cluster.nodes if n.pid is not None and _proc_state(n.pid) not in ("T", "t")]
    others = [n for n in live if n.node_id not in set(exclude)]
    return ",".join(n.bootstrap for n in others or live) or cluster.bootstrap


def _poll(what: str, timeout: float, probe: Callable[[], str | None], interval: float = 0.25) -> None:
    """Call ``probe`` until it returns None (done), at most ``timeout`` s; each other answer
    (or exception) is why not yet, quoted by the TimeoutError."""
    deadline = time.monotonic() + timeout
    last = "not tried"
    while True:
        try:
            answer = probe()
        except _NodeExited:
            raise
        except Exception as exc:  # a client that cannot answer yet: ask again until the deadline
            answer = repr(exc)
        if answer is None:
            return
        last = answer
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{NAME}: {what} not within {timeout:.0f} s: {last}")
        time.sleep(interval)


def _metadata(admin: Any, timeout: float = 5.0) -> Any:
    return admin.list_topics(timeout=timeout)


def _states(metadata: Any, topic: str) -> dict[int, PartitionState]:
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        raise LookupError(f"topic {topic!r}: {None if found is None else found.error}")
    return {
        p.id: PartitionState(partition=p.id, leader=p.leader, replicas=tuple(p.replicas), isr=tuple(p.isrs))
        for p in found.partitions.values()
    }


def _health(cluster: ClusterInfo, node_ids: Sequence[int], admin: Any) -> str | None:
    """Why nodes ``node_ids`` are not healthy yet, or None: each answers on its port, is an
    unfenced broker in the metadata, and is in the ISR of every partition it replicates."""
    for node_id in node_ids:
        node = cluster.node(node_id)
        if node.pid is None:
            return f"node {node_id} is not running"
        if _proc_state(node.pid) in ("T", "t"):
            return f"node {node_id} is paused"
        if not _can_connect(node.port):
            return f"node {node_id} does not accept connections on {node.port}"
    metadata = _metadata(admin)
    brokers = set(metadata.brokers)
    missing = [n for n in node_ids if n not in brokers]
    if missing:
        return f"node(s) {missing} not (yet) registered and unfenced: brokers {sorted(brokers)}"
    for topic in sorted(metadata.topics):
        for p in _states(metadata, topic).values():
            out = [n for n in node_ids if n in p.replicas and n not in p.isr]
            if p.leader < 0 or out:
                return f"{topic}[{p.partition}] leader {p.leader} replicas {list(p.replicas)} isr {list(p.isr)}"
    return None


def _wait_healthy(node_ids: Sequence[int], timeout: float, check: Callable[[], None] | None = None) -> None:
    # asked of the other nodes: a node just resumed from a pause still has its old metadata
    admin = _admin(_live_bootstrap(_info(_state_or_raise()), exclude=node_ids))

    def probe() -> str | None:
        if check is not None:
            check()
        return _health(_info(_state_or_raise()), node_ids, admin)

    _poll(f"node(s) {list(node_ids)} healthy", timeout, probe)


def _probe_writes(cluster: ClusterInfo, timeout: float) -> None:
    """A 3-partition RF-3 topic is created, a transactional producer commits a record to each
    partition, a consumer group reads them ``read_committed`` and commits its offsets (so the
    transaction state and the consumer offsets topics exist), and the topic is deleted."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
    from confluent_kafka.cimpl import NewTopic

    deadline = time.monotonic() + timeout
    admin = _admin(cluster.bootstrap)

    def create() -> str | None:
        futures = admin.create_topics([NewTopic(_PROBE_TOPIC, 3, 3)], operation_timeout=15, request_timeout=20)
        try:
            futures[_PROBE_TOPIC].result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        return None

    _poll("a topic of RF 3 created", max(1.0, deadline - time.monotonic()), create, interval=0.5)
    wait_in_sync([_PROBE_TOPIC], timeout=max(1.0, deadline - time.monotonic()))

    def write() -> str | None:
        producer = Producer(
            {"bootstrap.servers": cluster.bootstrap, "transactional.id": "idempotent-cluster-probe", **_QUIET}
        )
        left = max(1.0, deadline - time.monotonic())
        producer.init_transactions(min(30.0, left))
        producer.begin_transaction()
        for partition in range(3):
            producer.produce(_PROBE_TOPIC, b"probe", partition=partition)
        producer.commit_transaction(min(30.0, left))
        return None

    _poll("a transactional write to all 3 partitions", max(1.0, deadline - time.monotonic()), write, interval=0.5)

    def read() -> str | None:
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": "idempotent-cluster-probe",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **_QUIET,
            }
        )
        try:
            consumer.subscribe([_PROBE_TOPIC])
            seen = 0
            until = min(deadline, time.monotonic() + 30)
            while seen < 3 and time.monotonic() < until:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    seen += 1
            if seen < 3:
                return f"read {seen} of 3 probe records"
            consumer.commit(asynchronous=False)
            return None
        finally:
            consumer.close()

    _poll("the probe records read by a group", max(1.0, deadline - time.monotonic()), read, interval=0.5)
    admin.delete_topics([_PROBE_TOPIC], operation_timeout=15)[_PROBE_TOPIC].result()


# ----------------------------------------------------------------------------- life cycle


def up(*, timeout: float = 300.0, fresh: bool = True, workdir: str | None = None) -> ClusterInfo:
    """Start the three nodes and wait until the cluster is really usable.

    Idempotent: a cluster whose three nodes run and answer is returned as it is. Otherwise
    leftovers are stopped first (a stale state file is dropped; our JVMs of this workdir get
    SIGTERM, then SIGKILL). ``fresh=True`` wipes the workdir (only one created by us) and
    formats new data dirs with a new cluster id on newly chosen free ports; ``fresh=False``
    keeps the data and the ports of the previous run (the quorum's voters are fixed by port).

    Ready means: every node accepts connections and is an unfenced broker, a 3-partition
    RF-3 topic is created and in sync, a transactional producer commits to it and a consumer
    group reads it back ``read_committed`` (so ``__transaction_state`` and
    ``__consumer_offsets`` exist, at RF 3), the topic is deleted, and every partition of the
    cluster has its full ISR.

    Raises ValueError (a workdir we may not wipe), RuntimeError (install or format failed,
    a port held by another process, a node exited, or not ready within ``timeout`` s: the
    message has the last lines of the node's ``broker.log``; no JVM of ours is left
    running then).
    """
    started = time.monotonic()
    deadline = started + timeout
    with _lock():
        state = _read_state()
        if state is not None and all(_node_pid(state, n) is not None for n in NODES):
            cluster = _info(state)
            try:
                _wait_healthy(NODES, 10)
                return cluster
            except TimeoutError:
                pass
        if workdir is not None:
            target = pathlib.Path(workdir).expanduser().resolve()
        elif state is not None and not fresh:
            target = pathlib.Path(str(state["workdir"]))
        else:
            target = _default_workdir(NAME)
        if fresh:
            _check_wipeable(target)
        _stop_all(state, target, 20)
        _state_path().unlink(missing_ok=True)
        lib = install("kafka")
        kept = None if fresh or state is None or pathlib.Path(str(state["workdir"])) != target else state
        if kept is None and not fresh:
            with contextlib.suppress(OSError, ValueError):
                kept = json.loads((target / "service.json").read_text())
        _prepare_workdir(target, fresh)
        if kept is not None and isinstance(kept.get("nodes"), dict):
            nodes = {str(n): {"ports": dict(kept["nodes"][str(n)]["ports"]), "pid": None} for n in NODES}
            cluster_id = str(kept["cluster_id"])
        else:
            free = iter(_free_ports(2 * len(NODES), exclude=set()))
            nodes = {str(n): {"ports": {"port": next(free), "controller_port": next(free)}, "pid": None} for n in NODES}
            cluster_id = _kafka_cluster_id()
        new_state: dict[str, Any] = {
            "name": NAME,
            "workdir": str(target),
            "cluster_id": cluster_id,
            "nodes": nodes,
            "started_at": time.time(),
        }
        _write_state(new_state)
        try:
            _format(lib, new_state, deadline)
            for node_id in NODES:
                _spawn(lib, new_state, node_id)
            _wait_healthy(NODES, max(1.0, deadline - time.monotonic()), _check_started(new_state, NODES))
            cluster = _info(new_state)
            _probe_writes(cluster, max(1.0, deadline - time.monotonic()))
            wait_in_sync(None, timeout=max(1.0, deadline - time.monotonic()))
        except BaseException as exc:
            _stop_all(new_state, target, 5)
            _state_path().unlink(missing_ok=True)
            if isinstance(exc, TimeoutError):
                logs = "\n".join(f"--- node {n}:\n{_tail(_node_dir(target, n) / 'broker.log', 15)}" for n in NODES)
                raise RuntimeError(
                    f"{NAME} did not become ready within {timeout:.0f} s ({exc}); logs:\n{logs}"
                ) from exc
            raise
        new_state["ready_seconds"] = round(time.monotonic() - started, 2)
        _write_state(new_state)
        return _info(new_state)


def _stop_all(state: Mapping[str, Any] | None, workdir: pathlib.Path, timeout: float) -> bool:
    """Stop the recorded nodes and any JVM of ours in this workdir; True if any ran."""
    stopped = False
    if state is not None:
        # all at once: one by one, the last nodes would wait for a quorum that is gone
        pids = [pid for pid in (_node_pid(state, n) for n in NODES) if pid is not None]
        for pid in pids:
            _continue(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in pids:
            _terminate(pid, timeout)
        stopped = bool(pids)
    if pathlib.Path("/proc").is_dir():
        for pid in _our_jvms(_SPEC):
            if any(_is_ours(pid, _SPEC, _node_dir(workdir, n)) for n in NODES):
                _continue(pid)
                _terminate(pid, timeout)
                stopped = True
    return stopped


def down(timeout: float = 60.0) -> bool:
    """Stop the three nodes (SIGCONT a paused one, SIGTERM, SIGKILL after ``timeout`` s) and
    remove the state file; the data and logs stay until the next fresh :func:`up` or
    :func:`clean`. Returns True if a node was stopped, False if none was running."""
    with _lock():
        state = _read_state()
        stopped = False
        if state is not None:
            stopped = _stop_all(state, pathlib.Path(str(state["workdir"])), timeout)
        _state_path().unlink(missing_ok=True)
        return stopped


def status() -> ClusterInfo | None:
    """The cluster if all three nodes run and are healthy (see :func:`wait_healthy`), else
    None. Read-only: takes no lock."""
    state = _read_state()
    if state is None or any(_node_pid(state, n) is None for n in NODES):
        return None
    try:
        _wait_healthy(NODES, 5)
    except (TimeoutError, RuntimeError):
        return None
    return _info(state)


def clean() -> list[pathlib.Path]:
    """Remove this cache's cluster data (its default workdir) and, once empty, the directory
    holding it. Returns what was removed.

    Raises RuntimeError while a node runs (stop it first with :func:`down`)."""
    with _lock():
        state = _read_state()
        if state is not None and any(_node_pid(state, n) is not None for n in NODES):
            raise RuntimeError(f"{NAME} is running: stop it first (idempotent services down {NAME})")
        return _remove_workdir(NAME)


# ----------------------------------------------------------------------------- questions


def info() -> ClusterInfo:
    """The cluster's nodes as they are now (a killed node's ``pid`` is None).

    Raises RuntimeError if the cluster is not up."""
    return _info(_state_or_raise())


def bootstrap() -> str:
    """``127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``. Raises RuntimeError if the cluster is not up."""
    return info().bootstrap


def url() -> str:
    """``kafka://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``. Raises RuntimeError if not up."""
    return info().url


def node_pids() -> dict[int, int | None]:
    """Each node's JVM pid, None for a node that is not running. RuntimeError if not up."""
    return {node.node_id: node.pid for node in info().nodes}


def partitions(topic: str, timeout: float = 30.0) -> dict[int, PartitionState]:
    """Leader, replicas and ISR of each partition of ``topic`` (the metadata of a running
    node). Raises TimeoutError if no node answers with the topic within ``timeout`` s."""
    admin = _admin(_live_bootstrap(info()))
    found: dict[int, PartitionState] = {}

    def probe() -> str | None:
        found.update(_states(_metadata(admin), topic))
        return None

    _poll(f"the metadata of {topic!r}", timeout, probe)
    return found


def leader_of(topic: str, partition: int, timeout: float = 30.0) -> int:
    """The node id leading ``topic[partition]``, waiting up to ``timeout`` s for it to have a
    leader that is a running node. Raises TimeoutError past that."""
    admin = _admin(_live_bootstrap(info()))
    leader: list[int] = []

    def probe() -> str | None:
        p = _states(_metadata(admin), topic).get(partition)
        if p is None:
            return f"{topic!r} has no partition {partition}"
        if p.leader < 0 or node_pids().get(p.leader) is None:
            return f"{topic}[{partition}] leader {p.leader}"
        leader.append(p.leader)
        return None

    _poll(f"a leader of {topic}[{partition}]", timeout, probe)
    return leader[0]


def _quorum_state(node: NodeInfo) -> tuple[int, int]:
    """(leader epoch, leader id) from the node's ``__cluster_metadata-0/quorum-state``."""
    path = node.data_dir / "__cluster_metadata-0" / "quorum-state"
    data = json.loads(path.read_text())
    return int(data.get("leaderEpoch", -1)), int(data.get("leaderId", -1))


def active_controller(timeout: float = 30.0) -> int:
    """The node id of the active controller (the quorum's leader).

    Read from the quorum state each running, not paused node writes to its
    ``__cluster_metadata-0/quorum-state`` at every election it learns of: the leader of the
    highest epoch, once that leader is a running node. (The admin API cannot tell: in KRaft
    a broker answers a client's metadata request with a random live broker as the
    "controller".) Raises TimeoutError if there is none within ``timeout`` s."""
    found: list[int] = []

    def probe() -> str | None:
        cluster = info()
        epochs = []
        for node in cluster.nodes:
            if node.pid is None or _proc_state(node.pid) in ("T", "t"):
                continue
            with contextlib.suppress(OSError, ValueError):
                epochs.append(_quorum_state(node))
        if not epochs:
            return "no running node has a quorum state"
        epoch, leader = max(epochs)
        if leader not in NODES:
            return f"no leader in epoch {epoch}"
        pid = cluster.node(leader).pid
        if pid is None or _proc_state(pid) in ("T", "t"):
            return f"the leader of epoch {epoch}, node {leader}, is down or paused"
        found.append(leader)
        return None

    _poll("an active controller", timeout, probe)
    return found[0]


def wait_in_sync(topics: Iterable[str] | None = None, timeout: float = 120.0) -> None:
    """Wait until every partition of ``topics`` (None: of every topic, the internal ones
    too) has a leader and its full ISR. Raises TimeoutError (naming a partition that is not)
    after ``timeout`` s, LookupError never: a topic not yet in the metadata is waited for."""
    wanted = None if topics is None else sorted(set(topics))
    admin = _admin(_live_bootstrap(info()))

    def probe() -> str | None:
        metadata = _metadata(admin)
        for topic in wanted if wanted is not None else sorted(metadata.topics):
            for p in _states(metadata, topic).values():
                if not p.in_sync:
                    return f"{topic}[{p.partition}] leader {p.leader} replicas {list(p.replicas)} isr {list(p.isr)}"
        return None

    _poll("full ISR", timeout, probe)


def wait_healthy(nodes: Iterable[int] = NODES, timeout: float = 120.0) -> None:
    """Wait until each of ``nodes`` runs, is not paused, accepts connections, is an
    unfenced broker in the metadata and is in the ISR of every partition it replicates.
    Raises TimeoutError after ``timeout`` s, RuntimeError if the cluster is not up."""
    node_ids = sorted(set(nodes))
    for node_id in node_ids:
        _check_node(node_id)
    _wait_healthy(node_ids, timeout)


def create_topic(
    topic: str,
    partitions: int = 6,
    replication_factor: int = 3,
    config: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> None:
    """Create ``topic`` and wait until all its partitions have their full ISR. Raises
    TimeoutError, or KafkaException for a refusal (TOPIC_ALREADY_EXISTS among them)."""
    from confluent_kafka.cimpl import NewTopic

    admin = _admin(_live_bootstrap(info()))
    new = NewTopic(topic, partitions, replication_factor, config=dict(config or {}))
    admin.create_topics([new], operation_timeout=min(30.0, timeout), request_timeout=min(30.0, timeout))[topic].result()
    wait_in_sync([topic], timeout)


# ----------------------------------------------------------------------------- faults


@contextlib.contextmanager
def _node_op(node_id: int) -> Iterator[dict[str, Any]]:
    _check_node(node_id)
    with _lock():
        yield _state_or_raise()


def kill9(node: int) -> None:
    """SIGKILL node ``node`` and wait until its process is gone (its ports free). Its data
    stays for :func:`start`. Raises RuntimeError if it is not running (or the cluster is not
    up), ValueError for an unknown node id."""
    with _node_op(node) as state:
        pid = _node_pid(state, node)
        if pid is None:
            raise RuntimeError(f"{NAME} node {node} is not running")
        _kill(pid)


def stop(node: int, timeout: float = 60.0) -> None:
    """Stop node ``node`` with Kafka's controlled shutdown (SIGTERM: its leaderships move to
    other nodes first) and wait until its process has exited (SIGKILL after ``timeout`` s).
    Raises RuntimeError if it is not running, ValueError for an unknown node id."""
    with _node_op(node) as state:
        if not _stop_node(state, node, timeout):
            raise RuntimeError(f"{NAME} node {node} is not running")


def start(node: int, timeout: float = 120.0) -> None:
    """Start node ``node`` again on its ports and kept data (after :func:`kill9` or
    :func:`stop`), and wait until it is healthy: an unfenced broker, back in the ISR of every
    partition it replicates (see :func:`wait_healthy`). A node that already runs is only
    waited for (a paused one is resumed first).

    Raises RuntimeError (cluster not up, a port held by another process, the node exited),
    TimeoutError (not healthy within ``timeout`` s; the node is left running),
    ValueError for an unknown node id."""
    with _node_op(node) as state:
        pid = _node_pid(state, node)
        if pid is None:
            _spawn(install("kafka", progress=False), state, node)
        else:
            _continue(pid)
        check = _check_started(state, [node])
    _wait_healthy([node], timeout, check)


def restart(node: int, timeout: float = 180.0) -> None:
    """:func:`stop` node ``node`` (controlled shutdown; a node that is down is just started),
    then :func:`start` it and wait until it is healthy again. Raises as those do."""
    deadline = time.monotonic() + timeout
    with _node_op(node) as state:
        _stop_node(state, node, min(60.0, timeout))
    start(node, timeout=max(1.0, deadline - time.monotonic()))


def rolling_restart(
    nodes: Sequence[int] = NODES,
    timeout_per_node: float = 180.0,
    on_restarted: Callable[[int], None] | None = None,
) -> None:
    """Restart ``nodes`` one at a time, as an upgrade does: before each, wait until every
    partition has its full ISR; then :func:`restart` the node (controlled shutdown, start,
    back in the ISR). ``on_restarted(node)`` is called after each. Raises as :func:`restart`
    and :func:`wait_in_sync` do, leaving the remaining nodes as they are."""
    for node in nodes:
        _check_node(node)
    for node in nodes:
        wait_in_sync(None, timeout=timeout_per_node)
        restart(node, timeout=timeout_per_node)
        if on_restarted is not None:
            on_restarted(node)
    wait_in_sync(None, timeout=timeout_per_node)


def pause(node: int) -> None:
    """SIGSTOP node ``node``'s JVM: it keeps its sockets open but answers nothing, and is
    fenced by the controller once its session (5 s) expires. Returns at once. Raises
    RuntimeError if it is not running, ValueError for an unknown node id."""
    with _node_op(node) as state:
        pid = _node_pid(state, node)
        if pid is None:
            raise RuntimeError(f"{NAME} node {node} is not running")
        os.kill(pid, signal.SIGSTOP)
        _poll(f"node {node} stopped", 10, lambda: None if _proc_state(pid) in ("T", "t") else "still running", 0.02)


def resume(node: int, timeout: float = 120.0) -> None:
    """SIGCONT node ``node`` after :func:`pause` and wait until it is healthy again (see
    :func:`wait_healthy`). Raises RuntimeError if it is not running, TimeoutError if not
    healthy within ``timeout`` s, ValueError for an unknown node id."""
    with _node_op(node) as state:
        pid = _node_pid(state, node)
        if pid is None:
            raise RuntimeError(f"{NAME} node {node} is not running")
        _continue(pid)
    _wait_healthy([node], timeout)


def heal(timeout: float = 180.0) -> None:
    """Undo every fault: start each node that is down (on its kept data), resume each paused
    one, and wait until all three are healthy and every partition has its full ISR (what a
    test calls after its faults, so that the next one meets a whole cluster). Raises as
    :func:`start` and :func:`wait_in_sync` do."""
    deadline = time.monotonic() + timeout
    with _lock():
        state = _state_or_raise()
        lib = None
        for node_id in NODES:
            pid = _node_pid(state, node_id)
            if pid is None:
                lib = lib or install("kafka", progress=False)
                _spawn(lib, state, node_id)
            else:
                _continue(pid)
        check = _check_started(state, NODES)
    _wait_healthy(NODES, max(1.0, deadline - time.monotonic()), check)
    wait_in_sync(None, timeout=max(1.0, deadline - time.monotonic()))
