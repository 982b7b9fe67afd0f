// Request metadata the controller and the workers agree on (docs/security.md).
#ifndef WSYNC_COMMON_LEASE_METADATA_H_
#define WSYNC_COMMON_LEASE_METADATA_H_

namespace wsync {

// RegisterWorker metadata: the lease this process held last. Re-registering
// an instance_id that a live lease holds replaces that lease only when this
// is its id (an instance id is listed, so it is no credential). A secret,
// like every lease id: never logged.
inline constexpr char kPreviousLeaseMetadata[] = "wsync-previous-lease";

}  // namespace wsync

#endif  // WSYNC_COMMON_LEASE_METADATA_H_
