//! Label values from data (a load's client, a model's name), bounded.
//!
//! A client comes from the API's `load_update`, so its name is a stranger's text: the
//! first [`MAX_VALUES`] distinct values of each label keep their name in the metrics
//! and later ones count as `other`, so a flood of new clients cannot grow the
//! metrics without bound.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

/// Distinct values one label keeps.
pub const MAX_VALUES: usize = 200;

/// The label of a load without a client.
pub const NO_CLIENT: &str = "none";

/// What stands for the values past the bound.
pub const OTHER: &str = "other";

struct Bounded(OnceLock<Mutex<BTreeSet<String>>>);

impl Bounded {
    fn label(&self, value: &str) -> String {
        let mut seen = self.0.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(value) {
            return value.to_owned();
        }
        if seen.len() < MAX_VALUES {
            seen.insert(value.to_owned());
            return value.to_owned();
        }
        OTHER.to_owned()
    }
}

static CLIENTS: Bounded = Bounded(OnceLock::new());
static MODELS: Bounded = Bounded(OnceLock::new());

/// The `client` label of a load's client.
pub fn client(client: Option<&str>) -> String {
    match client {
        None | Some("") => NO_CLIENT.to_owned(),
        Some(c) => CLIENTS.label(c),
    }
}

/// The `model` label of a model's name.
pub fn model(model: &str) -> String {
    MODELS.label(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_bound_are_other() {
        let b = Bounded(OnceLock::new());
        for i in 0..MAX_VALUES {
            assert_eq!(b.label(&format!("c{i}")), format!("c{i}"));
        }
        assert_eq!(b.label("one-too-many"), OTHER);
        assert_eq!(b.label("c0"), "c0", "a value seen keeps its name");
        assert_eq!(client(None), NO_CLIENT);
        assert_eq!(client(Some("")), NO_CLIENT);
    }
}
