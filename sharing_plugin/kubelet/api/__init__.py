"""Generated kubelet API code (deviceplugin/v1beta1, podresources/v1). Do not edit."""
