"""The one decoder of an image file, for training, the check and predict: TensorFlow's (``decode_image``),
converted to the channels asked for; an image at the run's size scaled to [0, 1] as an .npz's uint8 array is,
any other resized bilinearly to it; and a tensor of paths read and decoded in a loop inside the graph."""

from __future__ import annotations

from .base import scaled


def decode_uint8(contents, channels: int):
    """Encoded PNG/JPEG bytes -> uint8 [h, w, channels]: the one decoder of training, the check and predict."""
    import tensorflow as tf

    return tf.io.decode_image(contents, channels=channels, expand_animations=False)


def decode(contents, input_shape):
    """Encoded PNG/JPEG bytes (a string tensor) -> float32 [H, W, C] in [0, 1]; graph-safe."""
    import tensorflow as tf

    height, width, channels = input_shape
    image = decode_uint8(contents, channels)  # uint8 [h, w, C]
    at_size = tf.reduce_all(tf.equal(tf.shape(image)[:2], [height, width]))
    # An image at the size is converted as an .npz's uint8 array is (scaled), to the same bits: a kept split
    # (uint8 in memory) and a streamed one then train alike, and so does the same array in an .npz. Any other
    # is resized bilinearly, without antialiasing, as image_dataset_from_directory does.
    image = tf.cond(
        at_size,
        lambda: scaled(image),
        lambda: tf.image.resize(image, (height, width), method="bilinear") / 255.0,
    )
    return tf.ensure_shape(image, input_shape)


def decode_files(paths, input_shape, as_stored: bool = False):
    """Files ``paths`` (a string tensor [n]) read and decoded in a loop in the graph: float32 [n, H, W, C] as
    ``decode`` gives them, or with ``as_stored`` the uint8 images themselves (every one must be at the size)."""
    import tensorflow as tf

    if as_stored:
        one = lambda path: tf.ensure_shape(decode_uint8(tf.io.read_file(path), input_shape[2]), input_shape)  # noqa: E731
    else:
        one = lambda path: decode(tf.io.read_file(path), input_shape)  # noqa: E731
    spec = tf.TensorSpec(input_shape, tf.uint8 if as_stored else tf.float32)
    return tf.map_fn(one, paths, fn_output_signature=spec)
