//! The gRPC services of one node over [`crate::node::Node`]: ComputeService (the tenants'
//! API), NodeAdmin (the operators', computectl's backend) and NodeInfo (the router's). Each
//! handler turns the request into a domain call and the domain's error into a Status
//! (`api::status`), nothing more.

/// A gRPC trait implemented over inherent methods that take the request message and return
/// the response message or the node's [`crate::node::Error`]: each RPC unwraps its request,
/// calls its method and turns the error into a Status (`api::status`). `observed` services'
/// RPCs are also counted and timed under their names (`metrics::observe`).
macro_rules! rpcs {
    (@call observed [$name:literal] $body:expr) => {
        crate::metrics::observe($name, async move { $body }).await
    };
    (@call plain [$($name:literal)?] $body:expr) => {
        $body
    };
    (
        $how:ident impl $trait:ident for $ty:ty {
            streams { $($assoc:ident = $aty:ty;)* }
            $($rpc:ident($req:ty) -> $resp:ty = $method:ident $(as $name:literal)?;)*
        }
    ) => {
        #[tonic::async_trait]
        impl $trait for $ty {
            $(type $assoc = $aty;)*
            $(
                async fn $rpc(
                    &self,
                    req: tonic::Request<$req>,
                ) -> Result<tonic::Response<$resp>, tonic::Status> {
                    rpcs!(@call $how [$($name)?] {
                        Ok(tonic::Response::new(self.$method(req.into_inner()).await?))
                    })
                }
            )*
        }
    };
}
pub(crate) use rpcs;

pub mod admin;
pub mod compute;
pub mod info;

pub use admin::AdminService;
pub use compute::ComputeApi;
pub use info::InfoApi;
