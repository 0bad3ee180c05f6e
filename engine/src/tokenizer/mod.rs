//! Tokenizer, chat template and incremental detokenization (in progress).
