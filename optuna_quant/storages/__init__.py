"""Optuna storages for a study: opened with the heartbeat, the lock its workers share, their waits.

Nothing here knows of quantization: :mod:`.rdb` opens a storage, :mod:`.urls` names it, :mod:`.lock`
is the study lock, :mod:`.waiting` the bounded wait on other workers, :mod:`.artifacts` the check of the
paths a run writes to and the best model stored with the study.
"""
