"""What trainers print, read: the log families (plain, Hugging Face, Lightning,
the launchers'), their metrics, checkpoints on disk and the checkpoint a rank resumed from.
"""
