"""The figures of a study, for optuna-dashboard and the offline HTML report; reads the storage only."""
