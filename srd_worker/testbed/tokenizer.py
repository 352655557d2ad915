"""The testbed's own tokenizer: one token per character, plus whole-word tokens for the generator's words
and for the fixed prompt strings (the math system prompt and the boxed-answer instruction), so a prompt
costs about as many tokens as its question has words and numbers. Digits are always single tokens.

It is a ``PreTrainedTokenizerFast`` with a ChatML chat template (``<|im_start|>`` / ``<|im_end|>``, the
latter the EOS token) and ``<|endoftext|>`` as pad and BOS, saved and loaded like any Hugging Face
tokenizer. Characters outside printable ASCII and newline become ``<unk>``.
"""

from __future__ import annotations

from typing import Any

from srd_worker.tasks.prompts import BOXED_INSTRUCTION, SYSTEM_PROMPT
from srd_worker.testbed.generator import WORDS

#: ChatML, the same template srdq's tiny test model uses.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
#: Multi-character tokens (the longest match wins): fixed prompt strings, chat roles, the boxed marker, the
#: spaced operators of a solution line, the words with and without a leading space.
PHRASES: tuple[str, ...] = (
    (SYSTEM_PROMPT, BOXED_INSTRUCTION, "system", "user", "assistant", "\\boxed{")
    + (" + ", " - ", " * ", " / ", " = ")
    + WORDS
    + tuple(" " + w for w in WORDS)
)


def build_tokenizer() -> Any:
    """The testbed tokenizer (deterministic: same vocabulary and ids every time)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_tokens([AddedToken(p, normalized=False) for p in PHRASES])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
