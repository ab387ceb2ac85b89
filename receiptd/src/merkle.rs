//! RFC 9162 (RFC 6962) Merkle tree hashing: an incrementally kept frontier for the root, and
//! inclusion and consistency proofs with their verification (RFC 9162 §2.1.3 and §2.1.4).

use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

/// SHA-256(0x00 || leaf).
pub fn leaf_hash(leaf: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(leaf);
    h.finalize().into()
}

/// SHA-256(0x01 || left || right).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree: SHA-256 of the empty string.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// The roots of the perfect subtrees that make up a tree of `size` leaves, largest first (one per
/// set bit of `size`). Appending a leaf costs O(log n); so does the root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    /// (height, root) of each perfect subtree, heights strictly decreasing.
    nodes: Vec<(u8, Hash)>,
}

impl Frontier {
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn push(&mut self, leaf_hash: Hash) {
        self.nodes.push((0, leaf_hash));
        while self.nodes.len() >= 2 {
            let (h_right, right) = self.nodes[self.nodes.len() - 1];
            let (h_left, left) = self.nodes[self.nodes.len() - 2];
            if h_left != h_right {
                break;
            }
            self.nodes.truncate(self.nodes.len() - 2);
            self.nodes.push((h_left + 1, node_hash(&left, &right)));
        }
        self.size += 1;
    }

    /// MTH(D[size]): the subtree roots folded right to left.
    pub fn root(&self) -> Hash {
        let mut iter = self.nodes.iter().rev();
        let Some((_, last)) = iter.next() else {
            return empty_root();
        };
        iter.fold(*last, |acc, (_, left)| node_hash(left, &acc))
    }

    /// Storage form: size (8 bytes BE) then per node height (1 byte) and hash (32 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.nodes.len() * 33);
        out.extend_from_slice(&self.size.to_be_bytes());
        for (height, hash) in &self.nodes {
            out.push(*height);
            out.extend_from_slice(hash);
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Frontier> {
        let (size, rest) = bytes.split_first_chunk::<8>()?;
        let size = u64::from_be_bytes(*size);
        if rest.len() % 33 != 0 {
            return None;
        }
        let nodes: Vec<(u8, Hash)> = rest
            .chunks_exact(33)
            .map(|c| (c[0], c[1..].try_into().expect("33-byte chunk")))
            .collect();
        let covered: u64 = nodes
            .iter()
            .map(|(h, _)| 1u64.checked_shl(u32::from(*h)).unwrap_or(0))
            .sum();
        (covered == size).then_some(Frontier { size, nodes })
    }
}

/// MTH over a slice of leaf hashes (RFC 9162 §2.1.1), recursively; O(n).
pub fn root_of(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            let k = split_point(n);
            node_hash(&root_of(&leaves[..k]), &root_of(&leaves[k..]))
        }
    }
}

/// The largest power of two smaller than n (n > 1).
fn split_point(n: usize) -> usize {
    let mut k = 1;
    while k << 1 < n {
        k <<= 1;
    }
    k
}

/// PATH(m, D[n]) of RFC 9162 §2.1.3.1, leaf to root.
pub fn inclusion_proof(index: usize, leaves: &[Hash]) -> Vec<Hash> {
    let n = leaves.len();
    if n <= 1 {
        return Vec::new();
    }
    let k = split_point(n);
    if index < k {
        let mut path = inclusion_proof(index, &leaves[..k]);
        path.push(root_of(&leaves[k..]));
        path
    } else {
        let mut path = inclusion_proof(index - k, &leaves[k..]);
        path.push(root_of(&leaves[..k]));
        path
    }
}

/// PROOF(m, D[n]) of RFC 9162 §2.1.4.1 (empty when m is 0 or m == n).
pub fn consistency_proof(old_size: usize, leaves: &[Hash]) -> Vec<Hash> {
    if old_size == 0 || old_size >= leaves.len() {
        return Vec::new();
    }
    subproof(old_size, leaves, true)
}

fn subproof(m: usize, leaves: &[Hash], complete: bool) -> Vec<Hash> {
    let n = leaves.len();
    if m == n {
        return if complete {
            Vec::new()
        } else {
            vec![root_of(leaves)]
        };
    }
    let k = split_point(n);
    if m <= k {
        let mut proof = subproof(m, &leaves[..k], complete);
        proof.push(root_of(&leaves[k..]));
        proof
    } else {
        let mut proof = subproof(m - k, &leaves[k..], false);
        proof.push(root_of(&leaves[..k]));
        proof
    }
}

/// RFC 9162 §2.1.3.2: does `path` prove leaf `index` (hash `leaf`) in a tree of `size` with `root`?
pub fn verify_inclusion(index: u64, size: u64, leaf: &Hash, path: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    for p in path {
        if snode == 0 {
            return false;
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            if fnode & 1 == 0 {
                while fnode & 1 == 0 && fnode != 0 {
                    fnode >>= 1;
                    snode >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    snode == 0 && r == *root
}

/// RFC 9162 §2.1.4.2: does `proof` show the tree (`old_size`, `old_root`) is a prefix of
/// (`new_size`, `new_root`)?
pub fn verify_consistency(
    old_size: u64,
    new_size: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> bool {
    if old_size > new_size {
        return false;
    }
    if old_size == new_size {
        return proof.is_empty() && old_root == new_root;
    }
    if old_size == 0 {
        return proof.is_empty();
    }
    let mut path: Vec<Hash> = proof.to_vec();
    if old_size.is_power_of_two() {
        path.insert(0, *old_root);
    }
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    let (mut fnode, mut snode) = (old_size - 1, new_size - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if snode == 0 {
            return false;
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            if fnode & 1 == 0 {
                while fnode & 1 == 0 && fnode != 0 {
                    fnode >>= 1;
                    snode >>= 1;
                }
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    fr == *old_root && sr == *new_root && snode == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n)
            .map(|i| leaf_hash(format!("leaf {i}").as_bytes()))
            .collect()
    }

    #[test]
    fn frontier_root_matches_recursive_root() {
        let all = leaves(70);
        let mut f = Frontier::default();
        assert_eq!(f.root(), empty_root());
        for (i, l) in all.iter().enumerate() {
            f.push(*l);
            assert_eq!(f.root(), root_of(&all[..=i]), "size {}", i + 1);
            assert_eq!(Frontier::from_bytes(&f.to_bytes()), Some(f.clone()));
        }
    }

    #[test]
    fn proofs_verify_and_wrong_ones_do_not() {
        let all = leaves(33);
        for n in 1..=all.len() {
            let root = root_of(&all[..n]);
            for i in 0..n {
                let path = inclusion_proof(i, &all[..n]);
                assert!(verify_inclusion(i as u64, n as u64, &all[i], &path, &root));
                let other = (i + 1) % n;
                if other != i {
                    assert!(!verify_inclusion(
                        i as u64,
                        n as u64,
                        &all[other],
                        &path,
                        &root
                    ));
                }
            }
            for m in 1..=n {
                let proof = consistency_proof(m, &all[..n]);
                let old = root_of(&all[..m]);
                assert!(
                    verify_consistency(m as u64, n as u64, &old, &root, &proof),
                    "{m}->{n}"
                );
                if m < n {
                    assert!(
                        !verify_consistency(m as u64, n as u64, &all[0], &root, &proof) || m == 1
                    );
                }
            }
        }
    }

    #[test]
    fn corrupt_frontier_bytes_are_refused() {
        let mut f = Frontier::default();
        for l in leaves(5) {
            f.push(l);
        }
        let mut bytes = f.to_bytes();
        bytes[7] = 6;
        assert_eq!(Frontier::from_bytes(&bytes), None);
    }
}
