"""The exit statuses of ``python -m verl_omni.trainer.main_flowgrpo`` beyond 0 (done) and 1 (an error), so a
launcher can tell a deliberate stop from a crash. One home for all of them: add a new one here."""

# the reward-hacking guard stopped the run (reward.guard.action=stop); a checkpoint and the reason are written
GUARD_STOP = 3
