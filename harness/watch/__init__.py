"""What a defense's calls do outside their answers: the files and sockets they touch and the processes they start
(:mod:`~harness.watch.side_effects`), the process-wide settings and random generators they change
(:mod:`~harness.watch.process_state`, :mod:`~harness.watch.rng`), and the :class:`~harness.watch.guard.Guard` every
call into a defense passes through, which sees both, restores what it can and keeps what it saw for the flags.

A room of its own below the contracts (``harness.api.defense`` holds a guard): it imports torch, numpy and the
standard library only.
"""
