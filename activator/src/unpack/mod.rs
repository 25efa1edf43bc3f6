//! The safe layer unpacker. (owner: unpacker)
