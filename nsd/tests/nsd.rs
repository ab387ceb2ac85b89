//! nsd as a real process serving /ns over 9P on its operator socket: clone a namespace from a
//! spec, start its command through ctl, wait for it, kill one, refuse a bad spec.

mod common;

use common::*;
use warren_9p::{Client, Errno, oflags};

async fn read_file(root: &warren_9p::Fid, path: &str) -> Result<String, Errno> {
    let f = root.walk_path(path).await?;
    f.open(oflags::RDONLY).await?;
    let b = f.read_to_end(0).await?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

async fn write_file(root: &warren_9p::Fid, path: &str, data: &str) -> Result<(), Errno> {
    let f = root.walk_path(path).await?;
    f.open(oflags::WRONLY).await?;
    f.write_all(0, data.as_bytes()).await
}

async fn clone_ns(root: &warren_9p::Fid, spec: &str) -> Result<String, Errno> {
    let f = root.walk_path("clone").await?;
    f.open(oflags::RDWR).await?;
    f.write_all(0, spec.as_bytes()).await?;
    let id = f.read_to_end(0).await?;
    Ok(String::from_utf8_lossy(&id).trim().to_string())
}

const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ns_tree_clones_runs_waits_and_kills() {
    need_root();
    let nsd = start_nsd("wnsd");
    let client = Client::connect_unix(nsd.dirs.socket("ns")).await.unwrap();
    let root = client.attach("root", "").await.unwrap();

    let id = clone_ns(&root, &format!("{SYSTEM}env TERM\nlimit pids=64\n"))
        .await
        .unwrap();
    assert_eq!(id, "1");
    let spec = read_file(&root, "1/spec").await.unwrap();
    assert!(
        spec.contains("bind -r /usr /usr") && spec.contains("env TERM\n"),
        "{spec}"
    );
    assert_eq!(read_file(&root, "1/status").await.unwrap(), "created\n");
    write_file(&root, "1/ctl", "run /bin/sh -c 'exit 3'")
        .await
        .unwrap();
    assert_eq!(read_file(&root, "1/wait").await.unwrap(), "exited 3\n");
    assert_eq!(read_file(&root, "1/status").await.unwrap(), "exited 3\n");
    // A namespace runs its command once.
    assert_eq!(
        write_file(&root, "1/ctl", "run /bin/true").await,
        Err(Errno::EBUSY)
    );

    let id = clone_ns(&root, SYSTEM).await.unwrap();
    assert_eq!(id, "2");
    write_file(&root, "2/ctl", "run /bin/sleep 600")
        .await
        .unwrap();
    // The ctl write returned once the command exec'd: it is running now.
    let st = read_file(&root, "2/status").await.unwrap();
    assert!(st.starts_with("running holder="), "{st}");
    write_file(&root, "2/ctl", "kill").await.unwrap();
    assert_eq!(read_file(&root, "2/wait").await.unwrap(), "exited 137\n");

    // A bind of warren's own runtime dir is refused when nsd takes the spec in (its source is
    // opened and checked then, once), and the refusal says why on the next read.
    let runtime = nsd.dirs.runtime.display().to_string();
    let f = root.walk_path("clone").await.unwrap();
    f.open(oflags::RDWR).await.unwrap();
    f.write_all(0, format!("bind -r {runtime} /x\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(f.read_to_end(0).await, Err(Errno(libc::EACCES as u32)));
    let why = String::from_utf8(f.read_to_end(0).await.unwrap()).unwrap();
    assert!(why.contains("warren's runtime dir"), "{why}");

    // A spec that does not parse, or whose paths are refused, creates nothing.
    assert_eq!(clone_ns(&root, "bnd /a /b\n").await, Err(Errno::EINVAL));
    let names: Vec<String> = {
        let f = root.walk_path("").await.unwrap();
        f.open(oflags::RDONLY).await.unwrap();
        f.read_dir_names().await.unwrap()
    };
    assert_eq!(names, vec!["clone", "1", "2"], "{names:?}");
    assert_eq!(read_file(&root, "3/status").await, Err(Errno::ENOENT));
    assert_eq!(
        write_file(&root, "1/ctl", "frobnicate").await,
        Err(Errno::EINVAL)
    );
}
