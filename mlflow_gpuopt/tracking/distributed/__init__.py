"""Combining the ranks of a torchrun job into one run (rank 0 logs it).

``context``: which process of the job this is. ``comm_meter``: measured DDP / FSDP2
collective time and bytes, stamped on each step record. ``rank_rows``: what each rank reports
per interval (a fixed-width float row) and the rules rank 0 combines the rows by
(:class:`~.rank_rows.JobCombiner`). ``rank_gather``: the background thread that all-gathers
the rows. ``job``: a rank's state, tying those together for the tracker.
"""
