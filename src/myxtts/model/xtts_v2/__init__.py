"""Coqui's XTTS-v2 as a model family of myxtts: its GPT over DVAE codes with the Perceiver
conditioning encoder, its HiFi-GAN decoder of GPT latents with the ResNet speaker encoder,
and its DVAE, with state-dict names equal to the released ``model.pth``'s."""
