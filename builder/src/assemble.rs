//! Image config, manifests and index. (owner: builder)
