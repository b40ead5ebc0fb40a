//! The fence helper: single-document writes that apply only under a token
//! not smaller than the stored one.
