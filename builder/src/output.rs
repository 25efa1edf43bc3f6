//! Writing OCI layouts and oci-archive files. (owner: builder)
