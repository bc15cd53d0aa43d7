//! `ReadOnlyLog`: the log contract, and that reading writes nothing and creates no file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use haul_core::ids::LoadId;
use haul_sqlite::{ReadOnlyLog, SqliteConfig, SqliteStore};
use haul_store::{EventStore, LoadSelection, LogReader, NewEntry};
use serde_json::json;

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("haul-readonly-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn store(path: &Path) -> SqliteStore {
    let store = SqliteStore::open(&SqliteConfig::from_url(&format!("sqlite://{}", path.display())).unwrap()).unwrap();
    store.migrate().await.unwrap();
    store
}

/// Every file in `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

#[tokio::test]
async fn the_read_only_log_reads_what_the_store_appended() {
    let path = temp_dir().join("haul.db");
    let s = store(&path).await;
    let reader = ReadOnlyLog::open(&path).unwrap();
    haul_store::contract::log_reader_reads_what_was_appended(&s, &reader).await;
}

#[tokio::test]
async fn reading_writes_nothing_and_creates_no_file() {
    let dir = temp_dir();
    let path = dir.join("haul.db");
    {
        let s = store(&path).await;
        let l = LoadId::parse("L1").unwrap();
        let now = haul_core::time::from_ms(1_772_434_800_000);
        let e = NewEntry::stored("u1", "load_update", json!({"client": "a"}));
        s.append(&l, vec![e], 0, vec![], now).await.unwrap();
    }
    // The store is closed: what is on disk now must be what is on disk after reading.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let before = files(&dir);
    {
        let r = ReadOnlyLog::open(&path).unwrap();
        let loads = r.select_loads(&LoadSelection::default(), None, 10).await.unwrap();
        assert_eq!(loads.len(), 1);
        assert_eq!(r.read_log_page(&loads[0], 0, 10).await.unwrap().len(), 1);
    }
    let after = files(&dir);
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>(), "no file created or removed");
    assert!(before == after, "no byte changed");
    // A file that does not exist is an error, and is not created.
    let missing = dir.join("missing.db");
    let err = ReadOnlyLog::open(&missing).err().expect("a missing file is an error");
    assert!(err.to_string().contains("missing.db"), "{err}");
    assert!(!missing.exists(), "opening read-only created the file");
    // A database without haul's tables is refused, not migrated.
    let empty = dir.join("empty.db");
    rusqlite::Connection::open(&empty).unwrap().execute_batch("CREATE TABLE t (x)").unwrap();
    let err = ReadOnlyLog::open(&empty).err().expect("no log");
    assert!(err.to_string().contains("no haul log"), "{err}");
}
