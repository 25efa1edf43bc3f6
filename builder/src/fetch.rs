//! Pinned downloads and the content-addressed cache. (owner: builder)
