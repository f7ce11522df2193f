"""What the engine's steps did, for metrics: the per-step value its observers receive, with the
occupancy, counts, latencies and speculation acceptance in it (`step_stats`), and the tally that
collects them during steps from each choice's timeline and hands them over once per step
(`step_tally`). It knows nothing of the engine's scheduling; the engine tells it what happened.
"""
