"""A model's scores over a split: the test and validation loss and accuracy of the built-in loss, or a Keras loss's
loss and compiled metrics. What a run's epochs and summary report (training_run.Run) and what evaluate reports of
a trained run (trained.load_run), from the same batches and sums."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from .losses import cross_entropy


class Scorer:
    """Scores of ``model`` (and its ``keras_loss``, None for the built-in one) over ``data``'s splits, in batches
    of ``batch_size()`` examples (a callable: a run's micro-batch may change while it trains)."""

    def __init__(self, model, keras_loss, data, batch_size: Callable[[], int]):
        self.model, self.keras_loss, self.data = model, keras_loss, data
        self.batch_size = batch_size
        evaluate = keras_loss.evaluate_fn() if keras_loss else self._evaluate_batch
        self.evaluate_batch = tf.function(evaluate, input_signature=data.signature())

    def _evaluate_batch(self, x, y):
        logits = self.model.forward(x, False)
        return tf.reduce_sum(cross_entropy(y, logits)), tf.argmax(logits, 1, output_type=tf.int32)

    def test_batches(self, split=None):
        """(loss sum, labels, predicted classes) of each batch of the test split (or ``split``): what
        evaluate and a confusion matrix sum."""
        split = self.data.test if split is None else split
        for x, y in split.batches(np.arange(len(split)), self.batch_size()):
            batch_loss, predicted = self.evaluate_batch(x, y)
            yield float(batch_loss), y.numpy(), predicted.numpy()

    def evaluate(self, split=None):
        """(mean loss, accuracy) on the test split (or ``split``: the validation split)."""
        split = self.data.test if split is None else split
        loss_sum = correct = 0.0
        for batch_loss, labels, predicted in self.test_batches(split):
            loss_sum += batch_loss
            correct += int(np.sum(labels == predicted))
        return loss_sum / len(split), correct / len(split)

    def task_scores(self, split) -> dict:
        """A Keras loss's run: the mean loss and every compiled metric over ``split``."""
        batches = split.batches(np.arange(len(split)), self.batch_size())
        return self.keras_loss.scores(batches, len(split), self.evaluate_batch)

    def scores(self) -> dict:
        """test_loss and test_accuracy (none without test examples), and validation_loss and
        validation_accuracy with data.validation; a Keras loss's run: test_ and validation_ of each of its scores."""
        scores = {}
        if self.keras_loss is not None:
            for prefix, split in (("test", self.data.test), ("validation", self.data.validation)):
                if split is not None and len(split):
                    scores.update({f"{prefix}_{name}": value for name, value in self.task_scores(split).items()})
            return scores
        if self.data.test is not None and len(self.data.test):
            scores["test_loss"], scores["test_accuracy"] = self.evaluate()
        if self.data.validation is not None:
            scores["validation_loss"], scores["validation_accuracy"] = self.evaluate(self.data.validation)
        return scores


def eval_batch_size(cfg, subdivisions: int) -> int:
    """Evaluation holds no gradients: twice a training micro-batch fits where one did (at least 100)."""
    from .batching import largest_micro_batch

    micro = cfg.micro_batch_size or largest_micro_batch(cfg.batch_size, 1, subdivisions)
    return max(2 * micro, 100)
