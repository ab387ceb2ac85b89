//! receiptd's records and its one append client.
//!
//! - The control socket (`<runtime>/receipts.ctl`): a trusted peer (nsd) hands receiptd one end
//!   of a connection with a [`ViewRecord`] naming one scope, and receiptd serves it a read-only
//!   view of that scope; [`hand_over`] is the sender.
//! - `/receipts/append` (`specs/receipts.md`): [`Appender`], one long-lived connection and one
//!   open of `append`, for the daemons and tools that write receipts; each append is answered
//!   with an [`Ack`].
//! - `/receipts/signer`: the key receiptd signs with, or why it has none ([`Signer`]); what `warren
//!   up`, `status` and `doctor` read to say whether receipts can be written at all.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use serde::{Deserialize, Serialize};
use warren_9p::{Client, Errno, Fid, oflags};

use crate::control::ReplyForm;

pub const VIEW_VERSION: u32 = 1;

/// What a handed-over connection may read: one scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewRecord {
    pub version: u32,
    pub scope: String,
}

/// The trusted side: hands `conn` to receiptd as a view of `scope`, and returns once receiptd
/// serves it (or with its refusal).
pub fn hand_over(ctl_path: &Path, scope: &str, conn: impl AsFd) -> io::Result<()> {
    let record = ViewRecord {
        version: VIEW_VERSION,
        scope: scope.to_owned(),
    };
    crate::control::hand_over(
        ctl_path,
        &record,
        &[conn.as_fd()],
        ReplyForm::Framed,
        "receiptd",
        "the view",
    )
    .map(drop)
}

/// receiptd's acknowledgement of an append (`{"seq":…,"hash":…}`, `specs/receipts.md`): the
/// receipt's place in its scope's chain and its hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub seq: u64,
    pub hash: String,
}

/// Why an append was not acknowledged: the errno, and receiptd's reason when it gave one.
#[derive(Clone, Debug, thiserror::Error)]
#[error("append refused ({errno}): {message}")]
pub struct Refusal {
    pub errno: Errno,
    /// `{"error":{"code":..,"message":..}}` as receiptd wrote it, or the transport error.
    pub message: String,
}

pub struct Appender {
    _client: Client,
    fid: Fid,
}

impl Appender {
    /// Connects to receiptd's socket and opens `append`.
    pub async fn connect(socket: &Path) -> std::io::Result<Appender> {
        let client = Client::connect_unix(socket).await?;
        Self::on(client).await.map_err(std::io::Error::from)
    }

    /// Opens `append` on an attached connection.
    pub async fn on(client: Client) -> warren_9p::Result<Appender> {
        let root = client.attach("receipts", "").await?;
        let fid = root.walk(&["append"]).await?;
        fid.open(oflags::RDWR).await?;
        Ok(Appender {
            _client: client,
            fid,
        })
    }

    /// Appends one request (JSON bytes); returns its seq and hash once receiptd acknowledged it
    /// (after the WAL commit, or after the covering fdatasync under `--durable=fsync`).
    pub async fn append(&self, request: &[u8]) -> Result<Ack, Refusal> {
        parse(&self.call(request).await?)
    }

    /// Appends requests as one batch (`specs/receipts.md` §7): all of them or, refused, none.
    /// One receipt per request, in order.
    pub async fn append_batch(&self, requests: &[Vec<u8>]) -> Result<Vec<Ack>, Refusal> {
        let mut batch = Vec::with_capacity(requests.iter().map(|r| r.len() + 1).sum::<usize>() + 1);
        batch.push(b'[');
        for (i, r) in requests.iter().enumerate() {
            if i > 0 {
                batch.push(b',');
            }
            batch.extend_from_slice(r);
        }
        batch.push(b']');
        let acks: Vec<Ack> = parse(&self.call(&batch).await?)?;
        if acks.len() != requests.len() {
            return Err(Refusal {
                errno: Errno::EPROTO,
                message: format!("{} acks for {} requests", acks.len(), requests.len()),
            });
        }
        Ok(acks)
    }

    /// One write and its reply; a refusal carries receiptd's reason.
    async fn call(&self, request: &[u8]) -> Result<Vec<u8>, Refusal> {
        // One round trip: the write and the read are pipelined on the fid.
        self.fid
            .call(request)
            .await
            .map_err(|(errno, said)| Refusal {
                errno,
                message: if said.is_empty() {
                    errno.to_string()
                } else {
                    String::from_utf8_lossy(&said).into_owned()
                },
            })
    }
}

/// A reply read straight into its acks (no JSON tree in between: this is every call's path).
fn parse<T: serde::de::DeserializeOwned>(reply: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(reply).map_err(|e| Refusal {
        errno: Errno::EPROTO,
        message: format!("unexpected reply {}: {e}", String::from_utf8_lossy(reply)),
    })
}

/// The root file of `/receipts` that says whether receiptd can sign (`specs/receipts.md` §7).
pub const SIGNER_FILE: &str = "signer";

/// `/receipts/signer`, one JSON line: `{"keyid":K}` when a key is in force, `{"refused":WHY}`
/// when none is (then every append is refused, and with it every call the gate decides).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Signer {
    /// The keyid in force, or why appends are refused.
    pub fn in_force(self) -> Result<String, String> {
        match (self.keyid, self.refused) {
            (Some(keyid), None) => Ok(keyid),
            (_, Some(why)) => Err(why),
            (None, None) => Err("receiptd named no key".into()),
        }
    }
}

/// Asks the receiptd at `socket` whether it can sign: its keyid, or why not (no answer, or no
/// key in force). A daemon whose socket answers but which cannot append is not working.
pub async fn signer(socket: &Path) -> Result<String, String> {
    let read = async {
        let client = Client::connect_unix(socket).await?;
        let root = client.attach("operator", "").await?;
        let fid = root.walk(&[SIGNER_FILE]).await?;
        fid.open(oflags::RDONLY).await?;
        Ok::<_, io::Error>(fid.read_to_end(0).await?)
    };
    let bytes = read
        .await
        .map_err(|e| format!("{}: {SIGNER_FILE}: {e}", socket.display()))?;
    serde_json::from_slice::<Signer>(&bytes)
        .map_err(|e| format!("{}: {SIGNER_FILE}: {e}", socket.display()))?
        .in_force()
}
