"""The seed's forward kernel for sm_80 and newer: mma.sync tensor cores fed by cp.async and ldmatrix."""
