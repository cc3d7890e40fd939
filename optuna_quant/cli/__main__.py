"""``python -m optuna_quant.cli``: the ``optuna-quant`` command."""

import sys

from optuna_quant.cli.commands import main


sys.exit(main())
