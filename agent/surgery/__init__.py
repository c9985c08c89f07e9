"""Changing a live run's members (docs/SURGERY.md): a dead torchrun taken out of
the rendezvous, a warm spare held before it, a static world's restart on a new port.
"""
