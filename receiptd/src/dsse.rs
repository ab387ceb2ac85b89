//! DSSE (Dead Simple Signing Envelope, secure-systems-lab/dsse v1): the PAE encoding and the
//! envelope. Owned here rather than taken from a 0.1 crate: it is PAE, base64 and a struct.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// The payload type of a warren receipt body; it names the scheme, so a signature made over a
/// receipt cannot be presented as anything else the same key signs.
pub const RECEIPT_PAYLOAD_TYPE: &str = "application/vnd.warren.receipt.v1+json";

/// PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, lengths in ASCII decimal.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_type.len() + payload.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub keyid: String,
    /// Standard base64 of the raw signature.
    pub sig: String,
}

/// A DSSE envelope. Query receipts carry no signature (`signatures` empty): a signed checkpoint
/// covers them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// Standard base64 of the payload bytes.
    pub payload: String,
    pub signatures: Vec<Signature>,
}

impl Envelope {
    pub fn new(payload_type: &str, payload: &[u8]) -> Envelope {
        Envelope {
            payload_type: payload_type.to_owned(),
            payload: STANDARD.encode(payload),
            signatures: Vec::new(),
        }
    }

    pub fn payload_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        STANDARD.decode(&self.payload)
    }

    /// The canonical (RFC 8785) bytes: what the log stores, chains and puts in the Merkle tree.
    pub fn canonical(&self) -> Vec<u8> {
        warren_jcs::to_vec(self).expect("an envelope always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_dsse_spec_example() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("t", b"xy"), b"DSSEv1 1 t 2 xy".to_vec());
    }
}
