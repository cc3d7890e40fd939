"""Building int8 models with onnxruntime: loading, preparation, configurations, quantization.

Nothing here knows of Optuna. :mod:`.model_io` loads models and checks their inputs,
:mod:`.prepare` readies a model as it ships, :mod:`.config` says what one configuration is,
:mod:`.quantize` builds its QDQ model from calibration done once, :mod:`.torch_export` turns a
``torch.nn.Module`` into ONNX.
"""
