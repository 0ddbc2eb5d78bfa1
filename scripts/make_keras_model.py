"""Write a small Keras 3 model for Fashion-MNIST-shaped images (28x28x1, 10 logits) to a .keras file.

python scripts/make_keras_model.py my_model.keras
accum-train run configs/fmnist.yaml --set 'model={name: keras_file, path: my_model.keras}'
accum-train export runs/fmnist-DATE-TIME
"""

import sys

import keras

# The same model every time, so the README's example gives the same figures on every machine (an unseeded
# start made its three-update smoke run land anywhere from 0.29 to 0.68 test accuracy).
keras.utils.set_random_seed(0)
inputs = keras.Input(shape=(28, 28, 1))
x = keras.layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(inputs)
# accum-train pools its statistics over the micro-batches. momentum 0.9 (Keras' default is 0.99): the
# moving variance starts at 1 and keeps 0.99**n of that after n updates, still 9% after 240.
x = keras.layers.BatchNormalization(momentum=0.9)(x)
x = keras.layers.ReLU()(x)
x = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(x)
x = keras.layers.Flatten()(x)
outputs = keras.layers.Dense(10)(x)  # logits: no softmax (or set model.from_logits: false)
keras.Model(inputs, outputs).save(sys.argv[1])
