//! The recipe: TOML schema, parsing, validation. (owner: builder)
