"""The exit statuses of ``python -m verl_omni.trainer.main_flowgrpo`` that say more than "failed" (1).

One home for every documented status, so that a job script can branch on them (``docs/guide/training.md``,
"Preemption and exit statuses") and a new one cannot collide with an existing one. This module sits in
``utils`` (the lowest layer) so that any part of the package may name its status here.
"""

from __future__ import annotations

import signal

# the run was asked to stop by a preemption signal (trainer.preempt_signals), wrote a complete checkpoint of its
# last finished step and stopped cleanly: run the same command to resume. 143 is 128 + SIGTERM, what a shell,
# SLURM and Kubernetes already report for a job that SIGTERM ended, so their handling of a preempted job (requeue,
# "terminated", not "error") stays right, and it is unlike 1 (an error) or any small code a guard may use.
EXIT_PREEMPTED = 128 + signal.SIGTERM

# the reward-hacking guard stopped the run (reward.guard.action=stop): a checkpoint of the step it fired at and the
# reason (scorer, best, now, step) in the summary; the run learned to fool its reward, so resuming is not the fix
EXIT_GUARD_STOP = 3


# a second preemption signal ended the run at once, without waiting for a checkpoint: 137 is 128 + SIGKILL, what a
# scheduler reports when its grace ran out, which is what this stands for. No checkpoint is left half-written (a
# save in progress stays a ``.partial`` directory that resuming ignores): the same command resumes from the newest
# complete checkpoint, losing the steps after it.
EXIT_PREEMPT_FORCED = 128 + signal.SIGKILL
