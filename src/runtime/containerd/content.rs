//! Leases, the content store and image records.

use std::collections::HashMap;

use prost_types::FieldMask;
use tonic::Code;

use super::{call_err, Containerd, Result};
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::{
    CreateImageRequest, DeleteImageRequest, GetImageRequest, Image, InfoRequest, ListImagesRequest,
    ReadContentRequest, WriteAction, WriteContentRequest,
};
use containerd_client::types::Descriptor;

impl Containerd {
    /// Creates a lease that expires by itself after an hour, should we never delete it.
    pub async fn create_lease(&self, id: &str) -> Result<()> {
        let expire = chrono::Utc::now() + chrono::Duration::hours(1);
        let labels = HashMap::from([(
            "containerd.io/gc.expire".to_string(),
            expire.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )]);
        LeasesClient::new(self.channel.clone())
            .create(self.req(containerd_client::services::v1::CreateRequest {
                id: id.into(),
                labels,
            }))
            .await
            .map_err(call_err("Leases.Create", id))?;
        Ok(())
    }

    /// Deletes a lease, letting containerd's GC collect what nothing else references.
    pub async fn delete_lease(&self, id: &str) -> Result<()> {
        LeasesClient::new(self.channel.clone())
            .delete(self.req(containerd_client::services::v1::DeleteRequest {
                id: id.into(),
                sync: false,
            }))
            .await
            .map_err(call_err("Leases.Delete", id))?;
        Ok(())
    }

    /// Whether a blob is in the content store.
    pub async fn content_exists(&self, digest: &str) -> Result<bool> {
        match ContentClient::new(self.channel.clone())
            .info(self.req(InfoRequest {
                digest: digest.into(),
            }))
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(call_err("Content.Info", digest)(s)),
        }
    }

    /// Sets labels on a blob already in the store.
    pub async fn set_content_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<()> {
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        ContentClient::new(self.channel.clone())
            .update(self.req(containerd_client::services::v1::UpdateRequest {
                info: Some(containerd_client::services::v1::Info {
                    digest: digest.into(),
                    labels,
                    ..Default::default()
                }),
                update_mask: Some(FieldMask { paths }),
            }))
            .await
            .map_err(call_err("Content.Update", digest))?;
        Ok(())
    }

    /// Writes a blob into the content store under `digest` with `labels`. The request stream is
    /// fed from its own task: the call only returns once the server has the first message.
    pub async fn write_content(
        &self,
        digest: &str,
        data: Vec<u8>,
        labels: HashMap<String, String>,
        lease: &str,
    ) -> Result<()> {
        if self.content_exists(digest).await? {
            if !labels.is_empty() {
                self.set_content_labels(digest, labels).await?;
            }
            return Ok(());
        }
        const CHUNK: usize = 1 << 20;
        let total = data.len() as i64;
        let reference = format!("compute-{}", digest.trim_start_matches("sha256:"));
        let (tx, rx) = tokio::sync::mpsc::channel::<WriteContentRequest>(4);
        let expected = digest.to_string();
        // The feeder runs beside the call, in this task: the call answers only once the
        // server has the first message.
        let feed = async move {
            let mut offset = 0usize;
            while offset < data.len() {
                let end = (offset + CHUNK).min(data.len());
                let msg = WriteContentRequest {
                    action: WriteAction::Write as i32,
                    r#ref: reference.clone(),
                    total,
                    expected: expected.clone(),
                    offset: offset as i64,
                    data: data[offset..end].to_vec(),
                    labels: HashMap::new(),
                };
                if tx.send(msg).await.is_err() {
                    return;
                }
                offset = end;
            }
            let _ = tx
                .send(WriteContentRequest {
                    action: WriteAction::Commit as i32,
                    r#ref: reference,
                    total,
                    expected,
                    offset: total,
                    data: vec![],
                    labels,
                })
                .await;
        };
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let call = async {
            let mut client = ContentClient::new(self.channel.clone());
            let mut responses = match client.write(self.req_leased(stream, lease)).await {
                Ok(r) => r.into_inner(),
                Err(s) if s.code() == Code::AlreadyExists => return Ok(()),
                Err(s) => return Err(call_err("Content.Write", digest)(s)),
            };
            loop {
                match responses.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(()),
                    Err(s) if s.code() == Code::AlreadyExists => return Ok(()),
                    Err(s) => return Err(call_err("Content.Write", digest)(s)),
                }
            }
        };
        let ((), r) = futures::join!(feed, call);
        r
    }

    /// Reads a whole blob from the content store.
    pub async fn read_content(&self, digest: &str) -> Result<Vec<u8>> {
        let mut stream = ContentClient::new(self.channel.clone())
            .read(self.req(ReadContentRequest {
                digest: digest.into(),
                offset: 0,
                size: 0,
            }))
            .await
            .map_err(call_err("Content.Read", digest))?
            .into_inner();
        let mut out = Vec::new();
        while let Some(chunk) = stream
            .message()
            .await
            .map_err(call_err("Content.Read", digest))?
        {
            out.extend_from_slice(&chunk.data);
        }
        Ok(out)
    }

    /// Gets an image by name.
    pub async fn get_image(&self, name: &str) -> Result<Image> {
        let resp = ImagesClient::new(self.channel.clone())
            .get(self.req(GetImageRequest { name: name.into() }))
            .await
            .map_err(call_err("Images.Get", name))?;
        Ok(resp.into_inner().image.unwrap_or_default())
    }

    /// Lists the images of the namespace.
    pub async fn list_images(&self) -> Result<Vec<Image>> {
        let resp = ImagesClient::new(self.channel.clone())
            .list(self.req(ListImagesRequest { filters: vec![] }))
            .await
            .map_err(call_err("Images.List", ""))?;
        Ok(resp.into_inner().images)
    }

    /// Creates or replaces the image record `name` pointing at `target`.
    pub async fn put_image(
        &self,
        name: &str,
        target: Descriptor,
        lease: Option<&str>,
    ) -> Result<()> {
        let image = Image {
            name: name.into(),
            target: Some(target),
            ..Default::default()
        };
        let _ = self.delete_image(name).await;
        let msg = CreateImageRequest {
            image: Some(image),
            source_date_epoch: None,
        };
        let req = match lease {
            Some(l) => self.req_leased(msg, l),
            None => self.req(msg),
        };
        ImagesClient::new(self.channel.clone())
            .create(req)
            .await
            .map_err(call_err("Images.Create", name))?;
        Ok(())
    }

    /// Deletes an image record.
    pub async fn delete_image(&self, name: &str) -> Result<()> {
        ImagesClient::new(self.channel.clone())
            .delete(self.req(DeleteImageRequest {
                name: name.into(),
                sync: false,
                target: None,
            }))
            .await
            .map_err(call_err("Images.Delete", name))?;
        Ok(())
    }
}
