//! PostgreSQL's logs read-only, for tools that must never write to a store: `haul
//! replay` and `haul export-scenario`.
//!
//! One connection whose session defaults to read-only transactions
//! (`default_transaction_read_only`), and every read inside an explicit `READ ONLY`
//! transaction: a statement that tried to write would fail. No migration runs, no
//! schema is created.

use std::time::Duration;

use async_trait::async_trait;
use haul_core::ids::LoadId;
use haul_core::projection::Record;
use haul_store::backend::{Columns, load_id_row, record_row, shadow_row};
use haul_store::{LoadSelection, LogReader, ShadowCursor, ShadowDecision, StoreError, columns};
use tokio::sync::Mutex;
use tokio_postgres::NoTls;

use crate::rows::PgRow;
use crate::{pg, redact};

/// The logs of a PostgreSQL database (the schema of the URL's `search_path`), read-only.
pub struct ReadOnlyLog {
    client: Mutex<tokio_postgres::Client>,
    select_loads: tokio_postgres::Statement,
    read_page: tokio_postgres::Statement,
}

const SELECT_LOADS: &str = "SELECT load_id FROM loads WHERE load_id > $1
      AND ($2::bigint IS NULL OR updated_at >= $2)
      AND ($3::text IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.load_id = loads.load_id
           AND e.kind = 'load_update' AND e.payload::jsonb ->> 'client' = $3))
    ORDER BY load_id LIMIT $4";

const READ_LOG_PAGE: &str = concat!(
    "SELECT ",
    columns!(record_read_only),
    " FROM events WHERE load_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
);

impl ReadOnlyLog {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::new(format!("bad PostgreSQL url {}: {e}", redact(url))))?;
        config.connect_timeout(Duration::from_secs(5));
        let options = config.get_options().unwrap_or("").to_owned();
        config.options(format!("{options} -c default_transaction_read_only=on").trim());
        let (client, conn) =
            config.connect(NoTls).await.map_err(|e| crate::connect_failed(url, Some(&e), &crate::pg_reason(&e)))?;
        tokio::spawn(conn);
        let found = client
            .query_one("SELECT to_regclass('events') IS NOT NULL AND to_regclass('loads') IS NOT NULL", &[])
            .await
            .map_err(pg)?;
        if !found.try_get::<_, bool>(0).map_err(pg)? {
            return Err(StoreError::new(format!("{} holds no haul log (run haul migrate on it first)", redact(url))));
        }
        let select_loads = client.prepare(SELECT_LOADS).await.map_err(pg)?;
        let read_page = client.prepare(READ_LOG_PAGE).await.map_err(pg)?;
        Ok(ReadOnlyLog { client: Mutex::new(client), select_loads, read_page })
    }

    /// Whether a write in this session would be refused (`transaction_read_only` in a
    /// transaction begun as the reads begin theirs).
    pub async fn refuses_writes(&self) -> Result<bool, StoreError> {
        let mut client = self.client.lock().await;
        let tx = client.build_transaction().start().await.map_err(pg)?;
        let refused = tx.batch_execute("CREATE TEMPORARY TABLE haul_readonly_probe (x int)").await.is_err();
        tx.rollback().await.map_err(pg)?;
        Ok(refused)
    }

    async fn query<T>(
        &self,
        stmt: &tokio_postgres::Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        decode: fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut client = self.client.lock().await;
        let tx = client.build_transaction().read_only(true).start().await.map_err(pg)?;
        let rows = tx.query(stmt, params).await.map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        rows.iter().map(|r| decode(&PgRow(r))).collect()
    }
}

#[async_trait]
impl LogReader for ReadOnlyLog {
    async fn select_loads(
        &self,
        filter: &LoadSelection,
        after: Option<&LoadId>,
        limit: usize,
    ) -> Result<Vec<LoadId>, StoreError> {
        let after = after.map(|a| a.as_str()).unwrap_or("");
        let since = filter.since.map(haul_core::time::to_ms);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(&self.select_loads, &[&after, &since, &filter.client, &limit], load_id_row).await
    }

    async fn read_log_page(&self, load_id: &LoadId, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(&self.read_page, &[&load_id.as_str(), &(after_seq as i64), &limit], record_row).await
    }

    async fn read_shadow_page(
        &self,
        load_id: &LoadId,
        after: &ShadowCursor,
        limit: usize,
    ) -> Result<Vec<ShadowDecision>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] =
            &[&load_id.as_str(), &(after.event_seq as i64), &after.shadow, &limit];
        // Prepared on first use: a store migrated before shadow mode still replays.
        let stmt = {
            let client = self.client.lock().await;
            client.prepare(crate::sql::SHADOW_PAGE).await.map_err(|e| {
                if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
                    StoreError::new("this store has no shadow decisions table: run haul migrate on it (migration 10)")
                } else {
                    pg(e)
                }
            })?
        };
        self.query(&stmt, params, shadow_row).await
    }
}
