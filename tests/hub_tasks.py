"""Tiny KerasHub tasks built offline, for the tests and the guide's examples: a BERT text classifier and a GPT-2
causal LM, each with its preprocessor and a tokenizer over an inline vocabulary (nothing is downloaded), and raw
texts of skewed lengths."""

import keras_hub
import numpy as np

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "big", "red", "blue"]


def text_classifier(sequence_length=16, num_classes=3):
    """BertTextClassifier with its BertTextClassifierPreprocessor, one layer of width 8."""
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=sequence_length)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(vocabulary),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=sequence_length,
        dropout=0.0,
    )
    return keras_hub.models.BertTextClassifier(backbone, num_classes, preprocessor=preprocessor, dropout=0.0)


def causal_lm(sequence_length=16):
    """GPT2CausalLM with its GPT2CausalLMPreprocessor, one layer of width 8; its byte-pair merges spell each word."""
    vocabulary, merges = {"<|endoftext|>": 0}, []
    for word in WORDS:
        for spelled in (word, "\u0120" + word):  # GPT-2's byte-level space
            for character in spelled:
                vocabulary.setdefault(character, len(vocabulary))
            piece = spelled[0]
            for character in spelled[1:]:
                if f"{piece} {character}" not in merges:
                    merges.append(f"{piece} {character}")
                piece += character
                vocabulary.setdefault(piece, len(vocabulary))
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=len(vocabulary),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=sequence_length,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)


def texts(n, seed=0, longest=12):
    """``n`` sentences of 1 to ``longest`` words, most short (lengths drawn from a geometric distribution)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.geometric(0.3, n), longest)
    return np.array([" ".join(rng.choice(WORDS, size=int(length))) for length in lengths])
