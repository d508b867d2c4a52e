"""Joins Slurm jobs and containers onto a poll's readings: which job and which container runs each
GPU process, and which jobs and containers hold each GPU and MIG device.

A process's **job**:

1. with ``job_from_cgroup``, the job its cgroup path names (Slurm's cgroup plugin, v1 or v2
   layout).  The cgroup wins over the mapping files: it is where the kernel runs the process, and
   a file can be stale (an epilog that did not run);
2. else, where the mapping files list exactly one job for its device (its MIG GPU instance's file,
   else its GPU's), that job; with ``job_from_cgroup``, only a process whose cgroup is in no job
   is refused it (a node process, such as an agent or Xorg);
3. else none: several jobs share the device and nothing says which one the process is.

A GPU's (or MIG device's) jobs are those the files list for it (its allocation, held whether or
not a process runs) and those of its processes; where the two disagree, both count, and the
disagreement is logged once.  A job's user is its owner from the cgroup path (v1), else the user of
its first process seen; its account and partition are its processes' claims (``slurm``).  Learned
once per job, they stay while the job holds a device, so a job's labels do not change under it.

A process's **container** is the one its cgroup path names, with its name from the engine's API
where it answers (``engines``).  Where the engine answers for the container, it also vouches for
the path: a process whose cgroup, down to the container's, is not the container's init process's
gets no container (it stays its user's), and the refusal is logged once.  Names are asked off the
poll path: a poll waits for its new containers' names ``name_budget`` seconds at most in all, and
shows a container by its short ID until its name comes.  With pod attribution on, a Kubernetes
pod's process never gets one: pods stay its holder.  A process with a pod gets neither a job nor a
container.

Per-process facts are read once per process: cached by pid and start time (the reading's
``start_time``, from ``/proc/<pid>/stat``) while the process is listed.  A pid whose start time
changed is another process (the kernel reuses pids), whose facts are read again; so is one that
vanished from /proc, whose start time is then unknown.  A process that cannot be read, or exits
while it is read, gets neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

import structlog

from ..snapshot import ContainerRef, GpuReading, JobRef, MigReading, ProcessReading
from . import cgroups
from .engines import DEFAULT_BUDGET_S, EngineNames, Key, Known
from .slurm import JobClaim, JobMap, JobMappingDir, read_claim

log = structlog.get_logger(__name__)

_D = TypeVar("_D", GpuReading, MigReading)
MAX_JOBS = 4096  # jobs whose user, account and partition are remembered (those holding a device)
# One process: its pid and start time.  A pid alone may be a later process's (see the module).
ProcKey = tuple[int, int | None]


@dataclass(frozen=True, slots=True)
class _Proc:
    facts: cgroups.CgroupFacts
    claim: JobClaim


@dataclass
class _Job:
    user: str = ""
    account: str = ""
    partition: str = ""

    def ref(self, job: str) -> JobRef:
        return JobRef(job, self.user, self.account, self.partition)


class HolderAttributor:
    """Adds jobs and containers to readings; ``attach`` is the poller's hook."""

    def __init__(
        self,
        *,
        mapping: JobMappingDir | None = None,
        job_from_cgroup: bool = False,
        containers: bool = False,
        names: EngineNames | None = None,
        pod_mode: bool = False,
        proc_root: str = "/proc",
        user_of_uid: Callable[[int], str] = str,
        name_budget: float = DEFAULT_BUDGET_S,
    ) -> None:
        self.mapping = mapping
        self.job_from_cgroup = job_from_cgroup
        self.containers = containers
        self.names = names
        self.pod_mode = pod_mode
        self.proc_root = proc_root
        self._user_of_uid = user_of_uid
        self.name_budget = name_budget
        self._waited: set[Key] = set()  # containers a poll already waited for, while still nameless
        self._procs: dict[ProcKey, _Proc] = {}
        self._jobs: dict[str, _Job] = {}
        self._said: set[tuple[str, ...]] = set()

    @property
    def jobs(self) -> bool:
        """Slurm jobs are attributed (from the mapping files, the cgroups or both)."""
        return self.mapping is not None or self.job_from_cgroup

    def errors(self) -> dict[str, int]:
        """Failed reads by source, for each source that is on (job_mapping, engine_api)."""
        out = {}
        if self.mapping is not None:
            out["job_mapping"] = self.mapping.errors
        if self.names is not None:
            out["engine_api"] = self.names.errors
        return out

    def close(self) -> None:
        """Stops asking the engines (the daemon's shutdown)."""
        if self.names is not None:
            self.names.close()

    def attach(self, gpus: tuple[GpuReading, ...]) -> tuple[GpuReading, ...]:
        files: JobMap = self.mapping.read() if self.mapping is not None else {}
        # Each process once: the jobs its device's files list (its MIG instance's, else its GPU's).
        candidates: dict[ProcKey, tuple[str, ...]] = {}
        for g in gpus:
            whole = files.get((g.index, None), ())
            for m in g.migs:
                for p in m.processes:
                    candidates.setdefault(_key(p), files.get((g.index, m.gpu_instance_id), ()) or whole)
            for p in g.processes:
                candidates.setdefault(_key(p), whole)
        # A process no longer listed, or its pid now another process's, is forgotten.
        for gone in [k for k in self._procs if k not in candidates]:
            del self._procs[gone]
        claims: dict[ProcKey, Key] = {}
        done: dict[ProcKey, tuple[JobRef | None, ContainerRef | None]] = {}
        for g in gpus:
            for p in (*g.processes, *(p for m in g.migs for p in m.processes)):
                if _key(p) not in done and p.pod is None:
                    done[_key(p)] = self._process(p, candidates[_key(p)], claims)
        if claims:
            known = self._known(list(dict.fromkeys(claims.values())))  # each once, in the poll's order
            for proc, key in claims.items():
                done[proc] = (done[proc][0], self._container(proc, key, known.get(key)))
        out = []
        for g in gpus:
            migs = tuple(self._device(m, files.get((g.index, m.gpu_instance_id), ()), g.index, done)
                         for m in g.migs)  # fmt: skip
            out.append(replace(self._device(g, files.get((g.index, None), ()), g.index, done), migs=migs))
        self._forget_jobs(out)
        return tuple(out)

    # -- one device and one process ---------------------------------------------------------------

    def _device(
        self,
        d: _D,
        allocated: tuple[str, ...],
        gpu: int,
        done: dict[ProcKey, tuple[JobRef | None, ContainerRef | None]],
    ) -> _D:
        procs = tuple(p if _key(p) not in done else replace(p, job=done[_key(p)][0], container=done[_key(p)][1])
                      for p in d.processes)  # fmt: skip
        jobs = {j: self._job(j).ref(j) for j in allocated}
        for p in procs:
            if p.job is not None and p.job.job not in jobs:
                jobs[p.job.job] = p.job
                if allocated:
                    self._once("slurm_job_not_in_mapping", str(gpu), p.job.job, gpu=gpu, job=p.job.job,
                               allocated=list(allocated),
                               detail="a process runs in a job the mapping files do not list for its GPU; "
                                      "both count as holding it (is the prolog writing the files?)")  # fmt: skip
        containers = {p.container for p in procs if p.container is not None}
        return replace(d, processes=procs, jobs=tuple(sorted(jobs.values(), key=lambda j: j.job)),
                       containers=tuple(sorted(containers, key=lambda c: (c.engine, c.id))))  # fmt: skip

    def _process(self, p: ProcessReading, candidates: tuple[str, ...],
                 claims: dict[ProcKey, Key]) -> tuple[JobRef | None, ContainerRef | None]:  # fmt: skip
        info = self._procs.get(_key(p))
        if info is None:
            info = self._procs[_key(p)] = self._read(p)
        facts = info.facts
        if not facts.visible:
            # Not visible (another PID namespace, gone): only a device with one job can say whose it is.
            return (self._job(candidates[0]).ref(candidates[0]) if len(candidates) == 1 else None), None
        job_id: str | None = None
        if self.job_from_cgroup and facts.job is not None:
            job_id = facts.job
        elif len(candidates) == 1 and not (self.job_from_cgroup and facts.job is None):
            job_id = candidates[0]
        job = None
        if job_id is not None:
            self._learn(job_id, p, info)
            job = self._job(job_id).ref(job_id)
        # With pod attribution on, a pod's process is the pod's, whether or not its pod was found.
        pods_own = self.pod_mode and facts.kubepods
        if self.containers and facts.container_id is not None and facts.engine is not None and not pods_own:
            claims[_key(p)] = (facts.engine, facts.container_id)  # its container is settled with the others'
        return job, None

    def _known(self, keys: list[Key]) -> dict[Key, Known | None]:
        """What the engines said of each container, waiting once for those new to this poll (the
        budget in all); the others are read from the cache as they stand."""
        if self.names is None:
            return {}
        known = {key: self.names.lookup(*key) for key in keys}
        new = [key for key, k in known.items() if k is None and key not in self._waited]
        if new:
            self.names.settle(new, self.name_budget)
            known.update((key, self.names.lookup(*key)) for key in new)
        # Bounded by this poll's containers: one that leaves and comes back is waited for again.
        self._waited = {key for key, k in known.items() if k is None}
        return known

    def _container(self, proc: ProcKey, key: Key, known: Known | None) -> ContainerRef | None:
        engine, cid = key
        if known is not None and not known.holds(self._procs[proc].facts):
            # Its cgroup is named after the container but is not where the container runs: made by
            # someone who may create cgroups (inside another container): the process stays its user's.
            self._once("container_claim_refused", engine, cid, engine=engine, container_id=cid[:12], pid=proc[0],
                       detail="a process's cgroup names a container its engine runs elsewhere; "
                              "it is not counted as that container's")  # fmt: skip
            return None
        return ContainerRef(engine, cid, known.name if known is not None else "")

    # -- what is known of each job -----------------------------------------------------------------

    def _read(self, p: ProcessReading) -> _Proc:
        facts = cgroups.read(p.pid, self.proc_root) if self.job_from_cgroup or self.containers else _NOT_READ
        # A job's environment is read only where a job can come of it: not for containers alone.
        wants_claim = self.mapping is not None or (self.job_from_cgroup and facts.job is not None)
        claim = read_claim(p.pid, self.proc_root) if wants_claim else JobClaim()
        return _Proc(facts, claim)

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            if len(self._jobs) >= MAX_JOBS:
                self._jobs.clear()  # a backstop: the jobs holding devices are learned again
            job = self._jobs[job_id] = _Job()
        return job

    def _learn(self, job_id: str, p: ProcessReading, info: _Proc) -> None:
        job = self._job(job_id)
        if not job.user:
            uid = info.facts.job_uid if info.facts.job == job_id else None
            job.user = self._user_of_uid(uid) if uid is not None else (p.user or "")
        claim = info.claim
        if claim.job != job_id or not (claim.account or claim.partition):
            return
        if not (job.account or job.partition):
            job.account, job.partition = claim.account, claim.partition
        elif (claim.account, claim.partition) != (job.account, job.partition):
            self._once("slurm_job_claim_refused", job_id, claim.account, claim.partition, job=job_id, pid=p.pid,
                       claimed_account=claim.account, claimed_partition=claim.partition, account=job.account,
                       partition=job.partition,
                       detail="a process of the job claims another account or partition than its first one did; "
                              "the first is kept")  # fmt: skip

    def _forget_jobs(self, gpus: Iterable[GpuReading]) -> None:
        held = {j.job for g in gpus for j in g.jobs} | {j.job for g in gpus for m in g.migs for j in m.jobs}
        for job_id in [j for j in self._jobs if j not in held]:
            del self._jobs[job_id]

    def _once(self, what: str, *key: str, **fields: object) -> None:
        if (what, *key) in self._said:
            return
        if len(self._said) > 10_000:
            self._said.clear()
        self._said.add((what, *key))
        log.warning(what, **fields)


_NOT_READ = cgroups.CgroupFacts(visible=True)


def _key(p: ProcessReading) -> ProcKey:
    return (p.pid, p.start_time)
