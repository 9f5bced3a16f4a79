"""Diffusion workers forked from the engine's process instead of spawned (CPU platform only).

vLLM-Omni's executor starts its workers with ``spawn``; :func:`verl_omni.platforms.cpu_patches.patch_forked_workers`
(the version-gated patch) hands it :class:`ForkedWorkerStart` instead. This module holds what a safe fork needs and
touches no vLLM-Omni internals (only its config's public port field): torch on one thread in the child, the parent's
objects frozen across the fork so the child's collector never finalizes the parent's garbage, and a lone worker's
store on a port the OS assigns (docs/development.md, "Keeping the suite fast").
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)


def _forked_worker_main(target, *args) -> None:
    """In a forked diffusion worker: torch on one thread, the collector on, then vLLM-Omni's worker main ``target``.

    The engine's process has usually run torch ops on GNU OpenMP's thread pool before (a test's earlier
    work, a server's loading); libgomp's pool does not survive a fork, and the child's first parallel region
    waits forever on threads that do not exist. On one thread torch opens no OpenMP team (the tiny CPU
    models lose nothing; the cores are shared with the other processes of a run anyway).

    The parent's objects stay frozen here (:class:`_FrozenForkProcess`); the collector, off across the fork, is
    turned on for the worker's own objects, as it is in a spawned worker."""
    import torch

    torch.set_num_threads(1)
    gc.enable()
    _lone_worker_binds_any_port(args)
    target(*args)


def _lone_worker_binds_any_port(worker_args) -> None:
    """The engine's only worker takes whatever port the OS gives its ``torch.distributed`` store (``MASTER_PORT``
    0), instead of the one the engine's config picked when it was made.

    vLLM-Omni's config picks a free port in the engine's process (``OmniDiffusionConfig.master_port``), and the worker
    binds it only once it has started, seconds later on a busy machine; another process's connection can take it in
    between, and the worker then dies at start (``EADDRINUSE``; the engine sees its pipe close). With one rank no
    other process needs to know the port, so letting the OS assign it at the bind closes the window. Workers of a
    split engine (several ranks) keep the shared port: they must all reach the same store."""
    from vllm_omni.diffusion.data import OmniDiffusionConfig

    for arg in worker_args:
        if isinstance(arg, OmniDiffusionConfig) and arg.num_gpus == 1:
            arg.master_port = 0


# per thread: whether it is starting a forked worker (another thread's fork is none of ours), and what the fork
# hook found before the fork: (collector enabled, objects already frozen by someone else)
_forking = threading.local()


def _freeze_before_fork() -> None:
    """``os.register_at_fork(before=...)``, in the thread that starts a forked worker, at the last moment before
    ``fork()``: ``sys.stdout``/``sys.stderr`` flushed (which waits out another thread's write, so the child does
    not inherit a stream's lock held by a thread it lacks; multiprocessing flushes them too, a little earlier), the
    collector off and every object the parent tracks frozen (moved to the permanent generation)."""
    if not getattr(_forking, "active", False):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # None, or closed
            pass
    _forking.gc_state = (gc.isenabled(), gc.get_freeze_count() > 0)
    gc.disable()
    gc.freeze()


def _unfreeze_in_parent() -> None:
    """``after_in_parent``: the parent collects its own objects again (unless something else had frozen some)."""
    state = getattr(_forking, "gc_state", None) if getattr(_forking, "active", False) else None
    if state is None:
        return
    _forking.gc_state = None
    enabled, frozen_before = state
    if not frozen_before:
        gc.unfreeze()
    if enabled:
        gc.enable()


def _forked() -> None:
    """``after_in_child``: the worker's main thread (a copy of the starting thread) starts no worker of ours. (The
    parent's other threads' objects are not freed in the worker: their lost stacks still hold them.)"""
    _forking.active = False
    _forking.gc_state = None


_fork_hooks_registered = False


class _FrozenForkProcess:
    """Mixin of the fork context's ``Process``: the child never collects the parent's objects.

    A fork copies the parent's garbage (unreachable cycles its collector had not reached yet) but none of the
    parent's other threads. The child's first ``gc.collect()`` (vLLM's ``DeviceMemoryProfiler`` at model load)
    ran a finalizer of such garbage that waited on a lock or a thread of the parent, forever (the full suite's
    hang: two forked workers on a futex in ``gc.collect()``, 0.7 CPU-seconds in; a fork of a Ray driver that
    collected inherited ``ObjectRef`` cycles crashed the node's raylet here). With everything frozen at the
    fork (``gc.freeze``, as CPython's docs advise before a fork), the child's collector sees only the objects the
    child made; the parent's garbage is left to the parent. The freeze and the unfreeze run in fork hooks
    (``os.register_at_fork``), in the starting thread only, so no other thread's fork is touched."""

    def start(self) -> None:
        global _fork_hooks_registered
        if not _fork_hooks_registered:
            os.register_at_fork(before=_freeze_before_fork, after_in_parent=_unfreeze_in_parent, after_in_child=_forked)
            _fork_hooks_registered = True
        _forking.active = True
        try:
            super().start()
        finally:
            _forking.active = False


class ForkedWorkerStart:
    """What vLLM-Omni's executor module calls ``mp``: its forced spawn is ignored and each worker process runs
    :func:`_forked_worker_main` around its target, forked with the parent's objects frozen
    (:class:`_FrozenForkProcess`), unless this process has a ``torch.distributed`` default group (:meth:`forks`)."""

    def __init__(self) -> None:
        import multiprocessing

        self._fork = multiprocessing.get_context("fork")
        self._spawn = multiprocessing.get_context("spawn")
        self._process_class = type("FrozenForkProcess", (_FrozenForkProcess, self._fork.Process), {})

    @staticmethod
    def forks() -> bool:
        """Whether a worker started now is forked. Not from a process with a ``torch.distributed`` default group
        (a test that runs an FSDP actor beside an in-process engine): the fork inherits that group, vLLM's
        distributed set-up then keeps it, and the worker's first collective (the RPC status gather) waits forever on
        the parent's gloo threads, which a fork does not copy. Such a process spawns its workers, as vLLM-Omni does."""
        import torch.distributed as dist

        return not (dist.is_available() and dist.is_initialized())

    @property
    def _context(self):
        """The context of the workers started now; the executor's ``Event`` and ``Pipe`` must come from it too."""
        return self._fork if self.forks() else self._spawn

    def set_start_method(self, method: str, force: bool = False) -> None:
        """The executor's ``mp.set_start_method("spawn", force=True)``: a no-op, :meth:`forks` decides."""

    def Event(self):  # noqa: N802 (multiprocessing's name)
        return self._context.Event()

    def Pipe(self, duplex: bool = True):  # noqa: N802 (multiprocessing's name)
        return self._context.Pipe(duplex)

    def Process(self, target, args=(), **kwargs):  # noqa: N802 (multiprocessing's name)
        if not self.forks():
            logger.info("diffusion worker spawned, not forked: this process has a torch.distributed default group")
            return self._spawn.Process(target=target, args=args, **kwargs)
        return self._process_class(target=_forked_worker_main, args=(target, *args), **kwargs)
