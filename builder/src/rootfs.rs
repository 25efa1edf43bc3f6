//! Deterministic layer writing. (owner: builder)
