//! `haul eval --keep URL`: the logs every scenario made, copied into one store, so a
//! run of the library fills a store `haul replay` and `haul export-scenario` can read.
//!
//! Each scenario still runs in a fresh store of its own (a shared one would let one
//! scenario's leftover timers and retries fire in the next). When it ends, its loads'
//! logs are appended to the kept store record by record, with their `seq`, ids,
//! payloads and recording times, and nothing else (no outbox row, timer or queue
//! message), so nothing in the kept store is left to send.
//!
//! Scenarios reuse load ids (most of the library's load is `481207`) and client names
//! with other policies. A load id already kept is renamed `{id}-2`, `-3`, … on copy, in
//! every id and text of its log where it stands as a whole word (keys, timer ids,
//! derived event ids, the SOP's texts), which is what the same run under that id would
//! have recorded. A client whose policy differs from the one kept under its name is
//! renamed the same way in its `load_update`s. [`Keep::clients_toml`] gives the policies
//! of every kept client: the config a replay of the kept store needs to decide as the
//! scenarios did.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use haul_config::ClientConfig;
use haul_core::event::{EventBody, EventKind};
use haul_core::ids::LoadId;
use haul_core::projection::{Entry, Record};
use haul_core::sop::EtaPolicy;
use haul_store::{NewEntry, Store};
use serde_json::Value;

pub struct Keep {
    store: Arc<dyn Store>,
    inner: tokio::sync::Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each kept client's policy.
    clients: BTreeMap<String, EtaPolicy>,
    loads: usize,
    /// (as the scenario named it, as kept).
    renamed: Vec<(String, String)>,
}

impl std::fmt::Debug for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keep")
    }
}

/// Most renames of one id (`-2` … ) tried.
const MAX_RENAMES: usize = 10_000;

impl Keep {
    /// Opens (creating and migrating) the store at `url`.
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let store = haul_backends::open(url, None).await?;
        Ok(Keep { store, inner: Default::default() })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Loads kept so far, and those renamed (as named, as kept).
    pub async fn counts(&self) -> (usize, Vec<(String, String)>) {
        let inner = self.inner.lock().await;
        (inner.loads, inner.renamed.clone())
    }

    /// `[clients.NAME.eta_request]` sections with every kept client's policy.
    pub async fn clients_toml(&self) -> String {
        let inner = self.inner.lock().await;
        let mut out = String::from("# The clients' policies the kept loads were decided under (haul eval --keep).\n");
        for (name, p) in &inner.clients {
            out.push_str(&format!(
                "\n[clients.{name}.eta_request]\nretry_after = \"{}\"\nmax_attempts = {}\ntrigger_risk = \"{}\"\n",
                haul_core::time::format_duration(p.retry_after),
                p.max_attempts,
                p.trigger_risk.as_str()
            ));
        }
        out
    }

    /// Copies the logs of `loads` from `from`, renaming what collides.
    pub async fn copy(
        &self,
        from: &dyn Store,
        loads: &BTreeSet<LoadId>,
        clients: &BTreeMap<String, ClientConfig>,
    ) -> anyhow::Result<()> {
        let mut inner = self.inner.lock().await;
        let policies = haul_config::policies(clients);
        for load in loads {
            let (records, _) = from.read(load).await?;
            if records.is_empty() {
                continue;
            }
            let mut kept_as = load.to_string();
            for n in 2..MAX_RENAMES {
                if self.store.read_page(&LoadId::parse(&kept_as)?, 0, 1).await?.is_empty() {
                    break;
                }
                kept_as = format!("{load}-{n}");
            }
            let kept = LoadId::parse(&kept_as)?;
            if kept_as != load.as_str() {
                inner.renamed.push((load.to_string(), kept_as.clone()));
            }
            // Clients: the same name with another policy is another client here.
            let mut client_names = BTreeMap::new();
            for r in &records {
                let Entry::Event { body: EventBody::LoadUpdate(u), .. } = &r.entry else { continue };
                let Some(name) = u.client.as_deref() else { continue };
                if client_names.contains_key(name) {
                    continue;
                }
                let policy = policies.for_client(Some(name));
                let mut kept_name = name.to_owned();
                for n in 2..MAX_RENAMES {
                    match inner.clients.get(&kept_name) {
                        Some(p) if *p != policy => kept_name = format!("{name}-{n}"),
                        _ => break,
                    }
                }
                inner.clients.insert(kept_name.clone(), policy);
                client_names.insert(name.to_owned(), kept_name);
            }
            // Copied in the stored form: ids renamed wherever they stand in the payload.
            let rewrite = |r: &Record| -> NewEntry {
                let (mut entry_id, kind, mut payload) = (r.entry_id.clone(), r.kind().to_owned(), r.payload());
                if kept_as != load.as_str() {
                    entry_id = rename_word(&entry_id, load.as_str(), &kept_as);
                    rename_in(&mut payload, load.as_str(), &kept_as);
                }
                if kind == EventKind::LoadUpdate.as_str()
                    && let Some(Value::String(c)) = payload.get_mut("client")
                    && let Some(k) = client_names.get(c.as_str())
                {
                    *c = k.clone();
                }
                NewEntry::stored(entry_id, kind, payload)
            };
            // One append per recording time: the same records, the same seq and times.
            let mut version = 0;
            let mut i = 0;
            while i < records.len() {
                let at = records[i].recorded_at;
                let entries: Vec<NewEntry> =
                    records[i..].iter().take_while(|r| r.recorded_at == at).map(rewrite).collect();
                i += entries.len();
                version = self.store.append(&kept, entries, version, vec![], at).await?;
            }
            inner.loads += 1;
        }
        Ok(())
    }
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// `text` with every whole-word `old` (not next to a letter, digit, `_` or `-`) as `new`.
pub fn rename_word(text: &str, old: &str, new: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut prev: Option<char> = None;
    while let Some(i) = rest.find(old) {
        let before = rest[..i].chars().next_back().or(prev);
        let after = rest[i + old.len()..].chars().next();
        out.push_str(&rest[..i]);
        if before.is_some_and(is_word_char) || after.is_some_and(is_word_char) {
            out.push_str(old);
        } else {
            out.push_str(new);
        }
        prev = old.chars().next_back();
        rest = &rest[i + old.len()..];
    }
    out.push_str(rest);
    out
}

fn rename_in(v: &mut Value, old: &str, new: &str) {
    match v {
        Value::String(s) => *s = rename_word(s, old, new),
        Value::Array(a) => a.iter_mut().for_each(|x| rename_in(x, old, new)),
        Value::Object(o) => o.iter_mut().for_each(|(_, x)| rename_in(x, old, new)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::rename_word;

    #[test]
    fn renames_whole_words_only() {
        for (text, want) in [
            ("481207/ask:eta_request:ping_0700/1/send_sms", "481207-2/ask:eta_request:ping_0700/1/send_sms"),
            ("tmr:481207:ask:x:1", "tmr:481207-2:ask:x:1"),
            ("Load 481207: call them", "Load 481207-2: call them"),
            ("+15554812070", "+15554812070"),
            ("4812071 and 481207", "4812071 and 481207-2"),
            ("481207481207", "481207481207"),
        ] {
            assert_eq!(rename_word(text, "481207", "481207-2"), want, "{text}");
        }
    }
}
