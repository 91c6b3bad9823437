//! The core's one error type. Every error names the input field it is about, so that the
//! Python side can raise a `ValueError` that tells the user exactly what to fix.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreError {
    /// Where in the input the problem is, e.g. `providers[1]['gpu'][0].affinity`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl CoreError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for CoreError {}

pub type CoreResult<T> = Result<T, CoreError>;
