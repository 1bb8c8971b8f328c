//! Pure decisions for a ProxmoxMachine, by concept: whose a VM is and which
//! ID a clone takes (`identity`), what a clone is made from and where it
//! goes (`clone`), what its config must become (`vm_config`), its addresses
//! (`addresses`), where its seed goes (`seed`), and the provisioning's next
//! step (`step`). Nothing here holds a client.

pub mod addresses;
pub mod clone;
pub mod identity;
pub mod seed;
pub mod step;
pub mod vm_config;

pub use addresses::*;
pub use clone::*;
pub use identity::*;
pub use seed::*;
pub use step::*;
pub use vm_config::*;
