"""Rules both sides apply, pure (no I/O, no threads): secret masking, who is stuck
(verdict, stragglers, silent ranks' CPU), who a rendezvous waits for, the judge's rules.
The console may import this package.
"""
