"""Measuring int8 models against fp32: accuracy, paired latency, POT's loss and sensitivity.

Nothing here knows of Optuna. :mod:`.measurer` builds and measures one configuration;
:mod:`.evaluate`, :mod:`.latency` and :mod:`.loss` are its parts; :mod:`.sensitivity` and
:mod:`.profile` measure each layer once per study.
"""
