//! Placeholder: this crate is being built (see the open issues).
