//! A transaction guard: the transaction it opened is rolled back unless committed.

use std::ops::{Deref, DerefMut};

use super::{Client, ClientError};

/// A transaction open on a client's connection ([`Client::transaction`]). Put and get
/// through it as through the client; [`Transaction::commit`] ends it. Dropped without a
/// commit (an early return, `?`, a panic), it is rolled back: before the connection's next
/// request, or by the node at once when the connection closes.
///
/// ```no_run
/// # async fn transfer(client: &mut linkbus_client::Client) -> Result<(), linkbus_client::ClientError> {
/// use linkbus_plugin_api::Content;
/// let mut tx = client.transaction().await?;
/// let debit = tx.get("accounts", 1, std::time::Duration::from_secs(1)).await?;
/// tx.put(Content::buf("B:ledger".parse().unwrap(), format!("{} debited", debit.len()))).await?;
/// tx.commit().await?; // without this line, nothing happened
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Transaction<'c> {
    client: &'c mut Client,
    open: bool,
}

impl Client {
    /// Opens a transaction ([`Client::begin`]) and returns its guard.
    ///
    /// # Errors
    /// As [`Client::begin`].
    pub async fn transaction(&mut self) -> Result<Transaction<'_>, ClientError> {
        self.begin().await?;
        Ok(Transaction { client: self, open: true })
    }
}

impl Transaction<'_> {
    /// Commits the transaction ([`Client::commit`]). Returns how many messages it put and got.
    ///
    /// # Errors
    /// As [`Client::commit`]; the transaction is over either way (a refused commit rolled
    /// it back).
    pub async fn commit(mut self) -> Result<u32, ClientError> {
        self.open = false;
        self.client.commit().await
    }

    /// Rolls the transaction back now ([`Client::rollback`]).
    ///
    /// # Errors
    /// As [`Client::rollback`].
    pub async fn rollback(mut self) -> Result<u32, ClientError> {
        self.open = false;
        self.client.rollback().await
    }
}

impl Deref for Transaction<'_> {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.open {
            self.client.rollback_due = true;
        }
    }
}
