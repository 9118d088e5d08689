// The program each layer is linked into whole (CMakeLists.txt, lmscope_layer): it calls nothing, so
// the link succeeds only when every symbol the layer's objects need is in the layer or the layers it
// uses. A call into a layer above fails here, at build time.
int main() { return 0; }
