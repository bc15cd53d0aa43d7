//! Reading rows: columns as haul_store's decoders read them (a value of another type,
//! or a NULL, is a corrupt row, never a panic), the unique constraint a statement broke,
//! and a query's rows decoded.

use haul_store::StoreError;
use haul_store::backend::{Columns, CorruptRowError};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::FromSql;

use crate::pg;

/// Column `index` of a row: a value of another type, or a NULL where `T` has none, is a
/// corrupt row (`Row::get` would panic on either, taking the worker down with it).
pub(crate) fn col<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T, CorruptRowError> {
    row.try_get(index).map_err(|e| {
        let name = row.columns().get(index).map_or("?", |c| c.name());
        // The error itself only says "error deserializing column N"; its source says why.
        match std::error::Error::source(&e) {
            Some(why) => CorruptRowError::column(index, format!("{name}: {why}")),
            None => CorruptRowError::column(index, format!("{name}: {e}")),
        }
    })
}

/// A tokio-postgres row, read by haul_store's decoders.
pub(crate) struct PgRow<'a>(pub(crate) &'a Row);

impl Columns for PgRow<'_> {
    fn string(&self, index: usize) -> Result<String, CorruptRowError> {
        col(self.0, index)
    }

    fn opt_string(&self, index: usize) -> Result<Option<String>, CorruptRowError> {
        col(self.0, index)
    }

    fn i64(&self, index: usize) -> Result<i64, CorruptRowError> {
        col(self.0, index)
    }

    fn opt_i64(&self, index: usize) -> Result<Option<i64>, CorruptRowError> {
        col(self.0, index)
    }

    fn u32(&self, index: usize) -> Result<u32, CorruptRowError> {
        let n: i32 = col(self.0, index)?;
        u32::try_from(n).map_err(|e| CorruptRowError::column(index, e))
    }
}

/// The unique constraint a statement broke. On a partitioned table PostgreSQL names the
/// partition's index (`events_p03_load_id_entry_id_key`, `outbox_p11_pkey`), so callers
/// match on how the name ends.
pub(crate) fn constraint(e: &tokio_postgres::Error) -> Option<&str> {
    e.as_db_error().filter(|d| *d.code() == SqlState::UNIQUE_VIOLATION).and_then(|d| d.constraint())
}

pub(crate) type Params<'a> = &'a [&'a (dyn tokio_postgres::types::ToSql + Sync)];

/// A `LIMIT` value: a `usize` past `bigint` reads everything.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Runs a (cached) query on `client` and decodes each row.
pub(crate) async fn rows_on<T>(
    client: &deadpool_postgres::Object,
    sql: &str,
    params: Params<'_>,
    decode: fn(&dyn Columns) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let stmt = client.prepare_cached(sql).await.map_err(pg)?;
    client.query(&stmt, params).await.map_err(pg)?.iter().map(|r| decode(&PgRow(r))).collect()
}
