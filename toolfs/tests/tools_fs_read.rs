//! fs_read and fs_list through a real worker process: happy paths, paging, the deny-list,
//! non-regular files, and containment (`..`, symlinks pointing out of the root).

mod tools_support;

use std::os::unix::fs::symlink;

use nix::sys::stat::Mode;
use nix::unistd::mkfifo;
use serde_json::json;
use tools_support::*;

#[tokio::test]
async fn fs_read_reads_pages_and_says_when_truncated() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    worker_file(&repo.join("notes.md"), b"hello\nworld\n");
    let big: String = (0..300_000).map(|i| format!("{i:07}\n")).collect(); // 2.4 MB
    worker_file(&repo.join("big.txt"), big.as_bytes());
    let w = spawn("fs_read", &[("/home/me/repo", &repo, false)]);

    assert_eq!(
        assert_ok(&call(&w, json!({"path": "notes.md"})).await),
        "hello\nworld\n"
    );
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "/home/me/repo/notes.md"})).await),
        "hello\nworld\n"
    );
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "notes.md", "offset": 6, "length": 5})).await),
        "world"
    );

    let first = call(&w, json!({"path": "big.txt"})).await;
    let text = assert_ok(&first);
    assert!(text.starts_with("0000000\n"));
    assert!(
        text.contains(&format!(
            "[fs_read: truncated: bytes 0..{} of {}; call again with offset {}]",
            1 << 20,
            big.len(),
            1 << 20
        )),
        "{}",
        &text[text.len() - 200..]
    );
    let body = &text[..1 << 20];
    assert_eq!(body, &big[..1 << 20]);
    let rest = call(&w, json!({"path": "big.txt", "offset": 2_000_000})).await;
    assert_eq!(
        assert_ok(&rest),
        &big[2_000_000..],
        "a read to EOF is whole and unmarked"
    );
}

#[tokio::test]
async fn fs_read_refuses_deny_listed_names_naming_the_rule() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let cases = [
        (".env", ".env*"),
        (".env.local", ".env*"),
        ("server.key", "*.key"),
        ("cert.pem", "*.pem"),
        ("id_ed25519", "id_*"),
        ("app.db", "*.db*"),
        ("data.sqlite3", "*.sqlite*"),
    ];
    for (name, _) in cases {
        worker_file(&repo.join(name), b"SECRET");
    }
    std::fs::create_dir(repo.join("keys.d.db")).unwrap();
    worker_file(&repo.join("keys.d.db/plain.txt"), b"SECRET");
    let w = spawn("fs_read", &[("/r", &repo, false)]);
    for (name, rule) in cases {
        let out = call(&w, json!({"path": name})).await;
        assert_refused(&out, &["deny-list", rule]);
        assert!(!out.content.contains("SECRET"));
    }
    // A deny-listed directory on the way counts too.
    assert_refused(
        &call(&w, json!({"path": "keys.d.db/plain.txt"})).await,
        &["`*.db*`"],
    );
}

#[tokio::test]
async fn fs_read_refuses_fifos_directories_and_final_symlinks_without_blocking() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    mkfifo(&repo.join("pipe"), Mode::from_bits_truncate(0o666)).unwrap();
    std::fs::create_dir(repo.join("sub")).unwrap();
    worker_file(&repo.join("real.txt"), b"real");
    symlink("real.txt", repo.join("link.txt")).unwrap();
    worker_file(&repo.join("bin.dat"), &[0xff, 0xfe, 0x00]);
    let w = spawn("fs_read", &[("/r", &repo, false)]);
    // A blocking open of a FIFO with no writer would hang here (CALL_TIMEOUT then fails the test).
    assert_refused(&call(&w, json!({"path": "pipe"})).await, &["fifo"]);
    assert_refused(&call(&w, json!({"path": "sub"})).await, &["dir"]);
    assert_refused(
        &call(&w, json!({"path": "link.txt"})).await,
        &["symbolic link"],
    );
    assert_refused(&call(&w, json!({"path": "bin.dat"})).await, &["not UTF-8"]);
    assert_refused(
        &call(&w, json!({"path": "/etc/passwd"})).await,
        &["outside this tool's roots"],
    );
    assert_refused(
        &call(&w, json!({"path": "missing"})).await,
        &["no such file"],
    );
}

#[tokio::test]
async fn dotdot_and_outward_symlinks_resolve_inside_the_root() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let outside = scratch.worker_dir("outside");
    worker_file(&outside.join("secret.txt"), b"OUTSIDE");
    // Symlinks that point out of the root, absolutely and relatively.
    symlink(&outside, repo.join("abs")).unwrap();
    symlink("../outside", repo.join("rel")).unwrap();
    let w = spawn("fs_read", &[("/r", &repo, false)]);
    let deep = format!(
        "../../../../../../../../../..{}",
        outside.join("secret.txt").display()
    );
    for path in [
        "abs/secret.txt",
        "rel/secret.txt",
        "../outside/secret.txt",
        "/r/../outside/secret.txt",
        &deep,
    ] {
        let out = call(&w, json!({"path": path})).await;
        assert!(
            !out.content.contains("OUTSIDE"),
            "{path} escaped the root: {}",
            out.content
        );
        assert_refused(&out, &["no such file"]);
    }
    // The same names resolve to files inside the root once those exist: the kernel clamps `..`
    // and absolute symlink targets at the root rather than failing.
    let mirrored = repo.join(outside.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&mirrored).unwrap();
    worker_file(&mirrored.join("secret.txt"), b"INSIDE-ABS");
    std::fs::create_dir(repo.join("outside")).unwrap();
    worker_file(&repo.join("outside/secret.txt"), b"INSIDE-REL");
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "abs/secret.txt"})).await),
        "INSIDE-ABS"
    );
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "rel/secret.txt"})).await),
        "INSIDE-REL"
    );
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "../../outside/secret.txt"})).await),
        "INSIDE-REL"
    );
}

#[tokio::test]
async fn the_longest_root_prefix_wins() {
    let scratch = Scratch::new();
    let a = scratch.worker_dir("a");
    let b = scratch.worker_dir("b");
    worker_file(&a.join("f"), b"from a");
    std::fs::create_dir(a.join("sub")).unwrap();
    worker_file(&a.join("sub/f"), b"from a/sub");
    worker_file(&b.join("f"), b"from b");
    let w = spawn("fs_read", &[("/w", &a, false), ("/w/sub", &b, false)]);
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "/w/f"})).await),
        "from a"
    );
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "/w/sub/f"})).await),
        "from b"
    );
    assert_eq!(
        assert_ok(&call(&w, json!({"path": "sub/f"})).await),
        "from a/sub",
        "relative paths use the first root"
    );
    assert_refused(&call(&w, json!({"path": "/wsub/f"})).await, &["outside"]);
}

#[tokio::test]
async fn fs_list_shows_names_types_and_sizes_without_following_links() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    worker_file(&repo.join("a.txt"), b"12345");
    std::fs::create_dir(repo.join("dir")).unwrap();
    symlink("/etc/passwd", repo.join("link")).unwrap();
    mkfifo(&repo.join("pipe"), Mode::from_bits_truncate(0o600)).unwrap();
    let w = spawn("fs_list", &[("/r", &repo, false)]);
    let out = call(&w, json!({"path": "."})).await;
    let lines: Vec<&str> = assert_ok(&out).lines().collect();
    assert_eq!(lines[0], "a.txt\tfile\t5");
    assert!(lines[1].starts_with("dir\tdir\t"));
    assert_eq!(lines[2], "link\tsymlink\t11");
    assert_eq!(lines[3], "pipe\tfifo\t0");
    assert_eq!(lines.len(), 4);
    assert_refused(
        &call(&w, json!({"path": "a.txt"})).await,
        &["not a directory"],
    );
    assert_refused(
        &call(&w, json!({"path": "link"})).await,
        &["not a directory"],
    );
    assert_refused(
        &call(&w, json!({"path": "/"})).await,
        &["outside this tool's roots"],
    );
    assert_refused(
        &call(&w, json!({"path": ".env.d"})).await,
        &["deny-list", ".env*"],
    );
    // `..` lists the root itself, never its parent.
    assert_eq!(call(&w, json!({"path": "../.."})).await, out);
}

/// Hostile names: a newline and tabs that would forge a second entry (`id_rsa`), a bidi
/// override, invalid UTF-8 and a backslash. `fs_list` shows one escaped line per entry, with
/// nothing hidden, and `fs_read` and `fs_write` name each file back exactly as it is listed.
#[tokio::test]
async fn fs_list_escapes_names_and_file_tools_take_them_back() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let names: [&[u8]; 4] = [
        b"ok.txt\nid_rsa\tfile\t1675",
        "\u{202E}txt.exe".as_bytes(),
        b"bad\xff\xfename",
        b"back\\slash",
    ];
    for (i, name) in names.iter().enumerate() {
        worker_file(
            &repo.join(OsStr::from_bytes(name)),
            format!("file {i}").as_bytes(),
        );
    }
    let list = spawn("fs_list", &[("/r", &repo, false)]);
    let out = call(&list, json!({"path": "."})).await;
    let listing = assert_ok(&out);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), names.len(), "{listing}");
    assert!(
        !listing
            .chars()
            .any(|c| c != '\n' && c != '\t' && warren_daemon::escape::misleads(c)),
        "{listing:?}"
    );
    let listed: Vec<&str> = lines
        .iter()
        .map(|l| {
            let fields: Vec<&str> = l.split('\t').collect();
            assert_eq!(fields.len(), 3, "an entry forged a column: {l:?}");
            assert_eq!(fields[1], "file", "{l:?}");
            fields[0]
        })
        .collect();
    assert!(listed.contains(&r"ok.txt\u{000A}id_rsa\u{0009}file\u{0009}1675"));
    assert!(listed.contains(&r"\u{202E}txt.exe"));
    assert!(listed.contains(&r"bad\x{FF}\x{FE}name"));
    assert!(listed.contains(&r"back\\slash"));

    let read = spawn("fs_read", &[("/r", &repo, false)]);
    let write = spawn("fs_write", &[("/r", &repo, true)]);
    for (i, name) in names.iter().enumerate() {
        let shown = warren_daemon::escape::escape_bytes(name);
        assert!(listed.contains(&shown.as_str()), "{shown} not listed");
        let content = call(&read, json!({ "path": shown })).await;
        assert_eq!(assert_ok(&content), format!("file {i}"), "{shown}");
        let written = call(&write, json!({ "path": shown, "content": "new" })).await;
        assert_ok(&written);
        assert_eq!(
            std::fs::read(repo.join(OsStr::from_bytes(name))).unwrap(),
            b"new",
            "{shown}"
        );
    }
    // A backslash that starts no escape is an error, not a guess.
    assert_refused(
        &call(&read, json!({"path": r"back\slash"})).await,
        &["bad escape"],
    );
}
