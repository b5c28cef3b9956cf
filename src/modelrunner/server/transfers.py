"""Pulls and pushes as background jobs of the daemon, watched by any number of HTTP clients, the trust
policy applied to each pull (signing/enforce.py: which is why this sits above distribution/ and signing/).

Two clients pulling the same reference share one job (one download). Transfers run in threads; at most
`MAX_CONCURRENT_PULLS` transfer at once (DMR: 2), but the manifest is fetched before waiting for a slot, so
a bad reference or a 401 still answers with its HTTP status. When the last client of a job goes away (Ctrl-C
in the CLI) the job is cancelled, keeping its partial files for a resume.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from modelrunner.distribution.errors import TransferCancelled
from modelrunner.distribution.huggingface import HuggingFacePull
from modelrunner.distribution.progress import Event, ProgressReporter, event
from modelrunner.distribution.pull import RegistryPull, model_size_text
from modelrunner.distribution.push import RegistryPush
from modelrunner.errors import ModelRunnerError
from modelrunner.reference import Reference, parse_reference
from modelrunner.signing.enforce import check_pull, check_unsigned_source, record_pull
from modelrunner.store.store import ModelStore

log = logging.getLogger(__name__)

MAX_CONCURRENT_PULLS = 2


class TransferJob:
    def __init__(self, key: str, mode: str) -> None:
        self.key = key
        self.mode = mode
        self.events: list[Event] = []
        self.error: ModelRunnerError | None = None
        self.finished = False
        self.resolved = False  # past the point where errors are HTTP statuses
        self.watchers = 1
        self._cancel = threading.Event()
        self._cond = threading.Condition()

    # -- producer side -----------------------------------------------------------------------------

    def emit(self, item: Event) -> None:
        with self._cond:
            self.events.append(item)
            self._cond.notify_all()

    def mark_resolved(self) -> None:
        with self._cond:
            self.resolved = True
            self._cond.notify_all()

    def finish(self, error: ModelRunnerError | None) -> None:
        with self._cond:
            if error is not None:
                self.error = error
                if self.resolved:
                    self.events.append(
                        event("error", error.message, "push" if self.mode == "push" else "pull")
                    )
            self.finished = True
            self._cond.notify_all()

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # -- consumer side -----------------------------------------------------------------------------

    def wait_resolved(self) -> ModelRunnerError | None:
        """Block until events may stream; the error when the job failed before that."""
        with self._cond:
            self._cond.wait_for(lambda: self.resolved or self.finished)
            return None if self.resolved else self.error

    def next_events(self, index: int, timeout: float) -> tuple[list[Event], bool]:
        """Events from `index` on (waiting up to `timeout` for some), and whether the job is over."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.events) > index or self.finished, timeout)
            return self.events[index:], self.finished and len(self.events) >= index

    def attach(self) -> bool:
        with self._cond:
            if self.finished or self._cancel.is_set():
                return False
            self.watchers += 1
            return True

    def detach(self) -> None:
        with self._cond:
            self.watchers -= 1
            if self.watchers <= 0 and not self.finished:
                log.info("last client of %s went away: cancelling", self.key)
                self._cancel.set()


class TransferManager:
    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._jobs: dict[str, TransferJob] = {}
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_PULLS)

    def _start(self, key: str, mode: str, work: Callable[[TransferJob], None]) -> TransferJob:
        with self._lock:
            existing = self._jobs.get(key)
            if existing is not None and existing.attach():
                return existing
            job = TransferJob(key, mode)
            self._jobs[key] = job

        def target() -> None:
            error: ModelRunnerError | None = None
            try:
                work(job)
            except ModelRunnerError as exc:
                error = exc
            except Exception as exc:  # a bug: report it rather than leaving the clients hanging
                log.exception("%s failed", key)
                error = ModelRunnerError(f"{mode} failed: {type(exc).__name__}")
            finally:
                with self._lock:
                    if self._jobs.get(key) is job:
                        del self._jobs[key]
                job.finish(error)

        threading.Thread(target=target, name=f"{mode}-{key}"[:60], daemon=True).start()
        return job

    def _wait_for_slot(self, job: TransferJob, reporter: ProgressReporter) -> None:
        if self._slots.acquire(blocking=False):
            return
        reporter.status("Waiting for another pull to finish...")
        while not self._slots.acquire(timeout=0.2):
            if job.cancelled():
                raise TransferCancelled("the pull was cancelled")

    def start_pull(self, text: str, bearer_token: str | None = None) -> TransferJob:
        reference = parse_reference(text)  # a bad reference is a 400 before any job exists
        return self._start(f"pull:{reference}", "pull", lambda job: self._pull(job, reference, bearer_token))

    def _pull(self, job: TransferJob, reference: Reference, bearer_token: str | None) -> None:
        reporter = ProgressReporter(job.emit, "pull")
        if reference.is_huggingface:
            check_unsigned_source(reference, reporter)

            hf = HuggingFacePull(self.store, reference, reporter, job.cancelled, bearer_token)
            hf.resolve()
            job.mark_resolved()
            self._wait_for_slot(job, reporter)
            try:
                hf.run()
            finally:
                self._slots.release()
            return
        pull = RegistryPull(self.store, reference, reporter, job.cancelled, bearer_token)
        try:
            pull.resolve()
            verified = check_pull(pull, reporter)  # the trust policy, before any blob is stored
            job.mark_resolved()
            if pull.cached():
                record_pull(pull, verified)
                assert pull.manifest is not None
                reporter.success(f"Using cached model: {model_size_text(pull.manifest)}")
                return
            self._wait_for_slot(job, reporter)
            try:
                pull.run()
            finally:
                self._slots.release()
            record_pull(pull, verified)
        finally:
            pull.close()

    def start_push(self, name: str, bearer_token: str | None = None) -> TransferJob:
        target = parse_reference(name)
        self.store.get(name)  # a missing model is a 404 before any job exists
        return self._start(f"push:{target}", "push", lambda job: self._push(job, name, target, bearer_token))

    def _push(self, job: TransferJob, name: str, target: Reference, bearer_token: str | None) -> None:
        push = RegistryPush(
            self.store, name, target, ProgressReporter(job.emit, "push"), job.cancelled, bearer_token
        )
        push.prepare()
        job.mark_resolved()
        push.run()
