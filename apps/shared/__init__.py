"""What several commands share: the connection and size flags (`flags`), the worker pipe
protocol (`worker_pipe`), the simulated policies (`sim_policies`), the Slurm allocation
(`slurm`), the wording of a partly parked job's parts (`parts`). No command of its own
lives here."""
