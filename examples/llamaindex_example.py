from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.embeddings.normrank import NormRankEmbedding
from llama_index.vector_stores.normrank import NormRankVectorStore
from normrank import Weights

texts = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Photosynthesis turns light, water and carbon dioxide into sugar in green plants.",
    "The Great Wall of China stretches across northern China.",
    "Mitochondria produce most of the chemical energy a cell needs.",
]
embed = NormRankEmbedding()  # raw vectors: same ranking as the stock model, norm kept
store = NormRankVectorStore(encoder=embed.encoder, weights=Weights(a=0.02))
index = VectorStoreIndex.from_documents([Document(text=t) for t in texts], embed_model=embed,
                                        storage_context=StorageContext.from_defaults(vector_store=store))
for hit in index.as_retriever(similarity_top_k=2).retrieve("How do plants turn light into energy?"):
    print(f"{hit.score:.3f} (cos {hit.node.metadata['normrank']['cosine']:.3f})  {hit.node.text}")
