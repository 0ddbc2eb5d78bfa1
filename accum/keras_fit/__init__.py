"""accum_train.fit: model.fit with exact gradient accumulation, for any Keras 3 model, loss and data (fit.py)."""
