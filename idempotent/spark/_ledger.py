"""A batch job's ledger, and the driver's plan of a run (docs/spark.md, Running a job again).

Each output topic ``T`` has a ledger topic ``T.spark-jobs`` with 2 partitions. Partition 1
holds each job's anchor (its first record: every later run stores it again and finds its
offset in the DUPLICATE answer) and one record per run; partition 0 holds the segment,
``done`` and ``commit`` records of the runs (:mod:`idempotent.spark._rerun`).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import attrs
from pyspark.sql.types import StructType

import idempotent
from idempotent.core.outcomes import Outcome
from idempotent.core.request import ProduceRequest
from idempotent.producer.producer import Producer

from ..api import BrokerAPI
from ..errors import ConfigError
from ._columns import Identity, identity_of
from ._host import ensure_host
from ._identity import batch_producer_name
from ._options import Options
from ._rerun import DOCS, JobHistory, Mode, RunPlan, decode, encode, job_record, plan_run, run_record

LEDGER_SUFFIX = ".spark-jobs"
LEDGER_SEGMENTS = 0
LEDGER_RUNS = 1
LEDGER_READ = 1000


def _connect(url: str) -> BrokerAPI:
    return idempotent.connect(ensure_host(url))


def ledger_topic(topic: str) -> str:
    """The ledger topic of the batch jobs writing ``topic``."""
    return topic + LEDGER_SUFFIX


def read_ledger(broker: BrokerAPI, topic: str, partition: int, start: int) -> list[dict[str, Any]]:
    """Every ledger record of ``partition`` from offset ``start`` on."""
    out: list[dict[str, Any]] = []
    position = start
    while records := broker.read(ledger_topic(topic), partition, position, LEDGER_READ):
        out.extend(r for r in map(decode, (record.value for record in records)) if r is not None)
        position = records[-1].offset + 1
    return out


def prepare_topic(
    url: str, topic: str, partitions: str | None, *, monotonic: bool = False, ledger: bool = False
) -> int:
    """Create the topic on the driver (before tasks race to), with ``partitions`` if given;
    with ``monotonic``, set the topic's policy so that sequences may jump; with ``ledger``,
    create the jobs' ledger topic too. Returns the topic's partition count."""
    with contextlib.closing(_connect(url)) as broker:
        known = broker.topics()
        if topic not in known:
            if partitions is None:
                broker.partitions_for(topic)
            else:
                broker.create_topic(topic, int(partitions))
        if ledger and ledger_topic(topic) not in known:
            broker.create_topic(ledger_topic(topic), 2)
        if monotonic:
            broker.set_policy("monotonic", topic=topic)
        return broker.partitions_for(topic, create=False)


def _anchor(broker: BrokerAPI, topic: str, job: str, mode: Mode) -> tuple[int, Mode]:
    """Store the job's anchor once, or find it: ``(its offset in the runs partition, the
    job's mode)``.

    The anchor is sequence 0 of the producer ``spark/<job>/anchor`` on the runs partition:
    the first run stores it, every later one gets DUPLICATE with its offset. When the broker
    no longer has that producer's state (evicted among over ``max_producers`` others, or
    older than the producer expiry), the runs partition is scanned for the job's first
    anchor instead.

    Raises:
        ConfigError: another run of the job initialises its producers at the same moment, or
            the anchor cannot be read.
    """
    ledger = ledger_topic(topic)
    session = broker.init_producer(f"spark/{job}/anchor")
    start = broker.end_offset(ledger, LEDGER_SEGMENTS)
    value = encode(job_record(job, mode, start))
    request = ProduceRequest.build(ledger, LEDGER_RUNS, session.producer_id, session.producer_epoch, 0, [value])
    result = broker.submit_request(request).result()  # the client fails it when no answer comes in time
    if result.outcome not in (Outcome.ACCEPTED, Outcome.DUPLICATE):
        raise ConfigError(
            f"job {job!r}: could not find or store its ledger anchor ({result.outcome.name}); is another run of "
            "the same job starting? Run one at a time"
        )
    if result.outcome is Outcome.DUPLICATE and result.base_offset is not None:
        stored = broker.read(ledger, LEDGER_RUNS, result.base_offset, 1)
        record = decode(stored[0].value) if stored else None
        if record is None or record.get("kind") != "job":
            raise ConfigError(f"job {job!r}: its ledger anchor at offset {result.base_offset} cannot be read")
        return result.base_offset, Mode(record["mode"])
    if (
        result.outcome is Outcome.ACCEPTED
        and not session.state_lost
        and session.last_sequences[ledger, LEDGER_RUNS] < 0
    ):
        assert result.base_offset is not None  # ACCEPTED carries it
        return result.base_offset, mode  # the first run of the job
    return _first_anchor(broker, topic, job)


def _first_anchor(broker: BrokerAPI, topic: str, job: str) -> tuple[int, Mode]:
    """The offset and mode of the job's first anchor, scanning the runs partition."""
    position = 0
    while records := broker.read(ledger_topic(topic), LEDGER_RUNS, position, LEDGER_READ):
        for stored in records:
            record = decode(stored.value)
            if record is not None and record.get("kind") == "job" and record.get("job") == job:
                return stored.offset, Mode(record["mode"])
        position = records[-1].offset + 1
    raise ConfigError(f"job {job!r}: its ledger anchor cannot be found in {ledger_topic(topic)}")


@attrs.frozen
class BatchPlan:
    """What the driver hands every task of a batch write."""

    identity: Identity
    rerun: RunPlan
    #: offset of the job's anchor in the ledger's runs partition
    runs_start: int


def plan_batch(options: Options, schema: StructType) -> BatchPlan:
    """Plan a batch write on the driver: check the columns, prepare the topics, store the
    run's record, fence the producers of earlier runs and decide (:func:`plan_run`).

    Raises:
        ConfigError: bad columns or options, or a refused rerun; nothing was written to
            the output topic.
    """
    if not options.job:
        raise ConfigError(
            "option 'job' is required for a batch write: it names the write, so that running it again "
            "stores nothing twice (.option('job', 'orders-2026-11-24'))"
        )
    batch_producer_name(options.job, 0)  # validates the name
    identity = identity_of(schema, options)
    partitions = prepare_topic(
        options.url, options.topic, options.partitions, monotonic=identity.mode is not Mode.PARTITION, ledger=True
    )
    job, topic = options.job, options.topic
    run = uuid.uuid4().hex[:12]
    with contextlib.closing(_connect(options.url)) as broker:
        runs_start, _ = _anchor(broker, topic, job, identity.mode)
        with Producer(broker, linger_ms=0) as producer:  # anonymous: no producer record to store
            producer.send(ledger_topic(topic), encode(run_record(job, run)), partition=LEDGER_RUNS).result()
        runs = read_ledger(broker, topic, LEDGER_RUNS, runs_start)
        anchor = next(r for r in runs if r.get("kind") == "job" and r.get("job") == job)
        history = JobHistory.from_records(
            job, [*runs, *read_ledger(broker, topic, LEDGER_SEGMENTS, anchor["ledger_start"])]
        )
        last_sequences: dict[str, dict[int, int]] = {}
        if not history.committed:
            for name in sorted({s.producer for s in history.segments if s.run != run}):
                session = broker.init_producer(name)  # fences what is left of that run
                if session.state_lost:
                    raise ConfigError(
                        f"job {job!r}: the broker no longer remembers what the earlier run's producer {name!r} "
                        "stored (older than the producer expiry, 7 days by default), so a rerun could store rows "
                        f"twice: write under a new job name ({DOCS})"
                    )
                last_sequences[name] = {p: session.last_sequences[topic, p] for p in range(partitions)}
    rerun = plan_run(
        job, run, identity.mode, history, last_sequences, partitions, same_partitioning=options.same_partitioning
    )
    return BatchPlan(identity, rerun, runs_start)


def superseded(broker: BrokerAPI, topic: str, plan: RunPlan, runs_start: int) -> bool:
    """Whether a later run of the job started (it fences this run's producers, unless it
    read the ledger before this task's first segment record: then this task must stop)."""
    seen = False
    for record in read_ledger(broker, topic, LEDGER_RUNS, runs_start):
        if record.get("kind") == "run" and record.get("job") == plan.job:
            if seen:
                return True
            seen = record.get("run") == plan.run
    return False
